// CRC32C (Castagnoli, the iSCSI / ext4 / gRPC polynomial 0x1EDC6F41, reflected
// 0x82F63B78), as checkpoint files use it (docs/design/checkpoints.md).
//
// Uses the SSE4.2 crc32 instruction where the CPU has it (checked at run
// time), otherwise a byte-table loop; both give the same value.
// Thread safety: pure functions.
#ifndef FERRY_OPTIM_CRC32C_H_
#define FERRY_OPTIM_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace ferry::optim {

// Extends `crc` (the CRC32C of earlier bytes; 0 for none) over `n` bytes at
// `data`. Crc32c(Crc32c(0, a), b) == Crc32c(0, a + b).
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace ferry::optim

#endif  // FERRY_OPTIM_CRC32C_H_
