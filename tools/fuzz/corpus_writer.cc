#include "ferry/tools/fuzz/corpus_writer.h"

#include <cstdio>
#include <fstream>

namespace ferry::fuzz {

int CorpusMain(int argc, char** argv,
               const std::function<CorpusFiles()>& make_files) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const CorpusFiles files = make_files();
  for (const auto& [name, bytes] : files) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
      return 1;
    }
  }
  std::printf("wrote %zu files to %s\n", files.size(), dir.c_str());
  return 0;
}

}  // namespace ferry::fuzz
