// A fuzz target that aborts on exactly the input "crash" and prints a line
// for every other input, so corpus_main_test can check that the replay
// driver feeds every corpus file and that a crashing input fails the run.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input == "crash") std::abort();
  std::printf("input %zu bytes\n", size);
  return 0;
}
