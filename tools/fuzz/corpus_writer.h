// The main() of a seed-corpus generator: writes named inputs, one file each,
// into the directory given as the only argument.
//
//   int main(int argc, char** argv) {
//     return ferry::fuzz::CorpusMain(argc, argv, [] { return Files{...}; });
//   }
#ifndef FERRY_TOOLS_FUZZ_CORPUS_WRITER_H_
#define FERRY_TOOLS_FUZZ_CORPUS_WRITER_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::fuzz {

// (file name, contents) pairs.
using CorpusFiles = std::vector<std::pair<std::string, std::string>>;

// Returns the process exit code: 2 on bad usage, 1 when a file cannot be
// written (naming it), 0 otherwise.
int CorpusMain(int argc, char** argv,
               const std::function<CorpusFiles()>& make_files);

}  // namespace ferry::fuzz

#endif  // FERRY_TOOLS_FUZZ_CORPUS_WRITER_H_
