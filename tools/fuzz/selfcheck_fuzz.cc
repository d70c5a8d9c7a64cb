// A fuzz target for the fuzz tooling itself: parses a tiny length-prefixed
// record and checks the invariant the parser promises.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  size_t len = data[0];
  if (len > size - 1) return 0;  // Truncated record: rejected, not read.
  size_t sum = 0;
  for (size_t i = 0; i < len; ++i) sum += data[1 + i];
  if (sum > 255 * len) std::abort();  // Cannot happen; the fuzzer checks it.
  return 0;
}
