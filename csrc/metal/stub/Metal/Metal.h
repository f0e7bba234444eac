// A stub of the Metal API subset csrc/metal/metal_backend.mm uses, for a syntax check with
// clang on any machine (tests/test_metal_runtime.py). Declarations only; nothing links.
#pragma once
#import <Foundation/Foundation.h>

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;
static inline MTLSize MTLSizeMake(NSUInteger w, NSUInteger h, NSUInteger d) {
  MTLSize s = {w, h, d};
  return s;
}

typedef enum : NSUInteger { MTLResourceStorageModeShared = 0 } MTLResourceOptions;
typedef enum : NSUInteger { MTLLanguageVersion2_4 = (2 << 16) + 4 } MTLLanguageVersion;
typedef enum : NSUInteger {
  MTLCommandBufferStatusCompleted = 4,
  MTLCommandBufferStatusError = 5
} MTLCommandBufferStatus;

@protocol MTLFunction
@end

@protocol MTLLibrary
- (id<MTLFunction>)newFunctionWithName:(NSString *)functionName;
@end

@protocol MTLComputePipelineState
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@end

@protocol MTLBuffer
- (void *)contents;
@property(readonly) NSUInteger length;
@end

@protocol MTLCommandEncoder
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid
       threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLBlitCommandEncoder <MTLCommandEncoder>
- (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer
           sourceOffset:(NSUInteger)sourceOffset
               toBuffer:(id<MTLBuffer>)destinationBuffer
      destinationOffset:(NSUInteger)destinationOffset
                   size:(NSUInteger)size;
@end

@protocol MTLCommandBuffer
- (id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (id<MTLBlitCommandEncoder>)blitCommandEncoder;
- (void)commit;
- (void)waitUntilCompleted;
@property(readonly) MTLCommandBufferStatus status;
@property(readonly) NSError *error;
@end

@protocol MTLCommandQueue
- (id<MTLCommandBuffer>)commandBuffer;
@end

@interface MTLCompileOptions : NSObject
@property(readwrite, nonatomic) BOOL fastMathEnabled;
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLDevice
@property(readonly) MTLSize maxThreadsPerThreadgroup;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^)(void *pointer, NSUInteger length))deallocator;
- (id<MTLLibrary>)newLibraryWithSource:(NSString *)source
                               options:(MTLCompileOptions *)options
                                 error:(NSError **)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)function
                                                             error:(NSError **)error;
@end

extern "C" id<MTLDevice> MTLCreateSystemDefaultDevice(void);
