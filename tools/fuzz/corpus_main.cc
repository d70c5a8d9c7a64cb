// Replays fuzz corpus files (given as arguments) through the linked fuzz
// target. The target itself decides what is a bug: a crash, a sanitizer
// report or an abort fails the test; returning normally passes.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_FILE...\n", argv[0]);
    return 2;
  }
  // The empty input is always worth a try.
  LLVMFuzzerTestOneInput(nullptr, 0);
  int replayed = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read corpus file %s\n", argv[i]);
      return 1;
    }
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size());
    ++replayed;
  }
  std::printf("replayed %d corpus inputs\n", replayed);
  return 0;
}
