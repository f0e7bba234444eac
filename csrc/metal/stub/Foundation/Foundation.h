// A stub of the Foundation subset csrc/metal/metal_backend.mm uses, for a syntax check with
// clang on any machine (tests/test_metal_runtime.py). Declarations only; nothing links.
#pragma once

typedef unsigned long NSUInteger;
typedef signed char BOOL;
#define YES ((BOOL)1)
#define NO ((BOOL)0)
#define nil nullptr

typedef enum : NSUInteger { NSUTF8StringEncoding = 4 } NSStringEncoding;

__attribute__((objc_root_class))
@interface NSObject {
  Class isa;
}
+ (instancetype)alloc;
- (instancetype)init;
@end

@interface NSString : NSObject
+ (instancetype)stringWithUTF8String:(const char *)s;
- (instancetype)initWithBytes:(const void *)bytes
                       length:(NSUInteger)len
                     encoding:(NSStringEncoding)encoding;
- (const char *)UTF8String;
@end

@interface NSError : NSObject
@property(readonly, copy) NSString *localizedDescription;
@end
