// A stub of the MetalPerformanceShaders subset csrc/metal/metal_backend.mm uses (matrix
// multiplication), for a syntax check on any machine. Declarations only; nothing links.
#pragma once
#import <Metal/Metal.h>

typedef enum : unsigned int {
  MPSDataTypeFloat32 = 0x10000000 | 32,
  MPSDataTypeFloat16 = 0x10000000 | 16
} MPSDataType;

@interface MPSMatrixDescriptor : NSObject
+ (MPSMatrixDescriptor *)matrixDescriptorWithRows:(NSUInteger)rows
                                          columns:(NSUInteger)columns
                                         matrices:(NSUInteger)matrices
                                         rowBytes:(NSUInteger)rowBytes
                                      matrixBytes:(NSUInteger)matrixBytes
                                         dataType:(MPSDataType)dataType;
@end

@interface MPSMatrix : NSObject
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer
                        offset:(NSUInteger)offset
                    descriptor:(MPSMatrixDescriptor *)descriptor;
@end

@interface MPSMatrixMultiplication : NSObject
- (instancetype)initWithDevice:(id<MTLDevice>)device
                 transposeLeft:(BOOL)transposeLeft
                transposeRight:(BOOL)transposeRight
                    resultRows:(NSUInteger)resultRows
                 resultColumns:(NSUInteger)resultColumns
               interiorColumns:(NSUInteger)interiorColumns
                         alpha:(double)alpha
                          beta:(double)beta;
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)commandBuffer
                   leftMatrix:(MPSMatrix *)leftMatrix
                  rightMatrix:(MPSMatrix *)rightMatrix
                 resultMatrix:(MPSMatrix *)resultMatrix;
@end
