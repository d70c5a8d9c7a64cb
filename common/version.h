// Ferry's version, stated once. The admin service reports kVersion, and
// tools/install reads the three macros below for ferry.pc and
// FerryConfigVersion.cmake: change the number here and nowhere else.
#ifndef FERRY_COMMON_VERSION_H_
#define FERRY_COMMON_VERSION_H_

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 2
#define FERRY_VERSION_PATCH 0

#define FERRY_VERSION_STR_(x) #x
#define FERRY_VERSION_STR(x) FERRY_VERSION_STR_(x)

namespace ferry {

// "MAJOR.MINOR.PATCH", e.g. "0.2.0".
inline constexpr char kVersion[] = FERRY_VERSION_STR(FERRY_VERSION_MAJOR) "." FERRY_VERSION_STR(
    FERRY_VERSION_MINOR) "." FERRY_VERSION_STR(FERRY_VERSION_PATCH);

}  // namespace ferry

#endif  // FERRY_COMMON_VERSION_H_
