// Testing umbrella: the in-process agent (one queue the test delivers,
// reorders, duplicates, drops; workers it kills), for testing user code on
// the Agent seam as Ferry tests its own layers. Include as
// "ferry/testing.h"; link `@ferry//:testing` (testonly).
#ifndef FERRY_TESTING_H_
#define FERRY_TESTING_H_

#include "ferry/rpc/testing/in_process.h"

#endif  // FERRY_TESTING_H_
