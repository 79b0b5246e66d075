#pragma once
// Whether this test binary is built under AddressSanitizer (`make test SANITIZE=address,...`;
// GCC defines __SANITIZE_ADDRESS__, clang answers __has_feature). A test whose cost is repetition
// of the same code paths (a sweep, a finite-difference loop) repeats less there: the sanitizers
// look for memory errors and undefined behaviour on each path, which a repeat does not add to,
// and the Release run keeps the whole repetition for the numbers.

namespace meshtrain::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace meshtrain::testing
