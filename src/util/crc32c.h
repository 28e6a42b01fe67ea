// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 metadata and Btrfs: detects every error
// burst of up to 32 bits and any odd number of flipped bits. Used for whole-file checkpoint
// checksums (docs/checkpoint.md). Incremental: crc32c_update(crc32c_update(0, a), b) equals
// the CRC of a followed by b.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tg {

// The CRC-32C of `data` continued from `crc` (0 for the first piece).
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);

}  // namespace tg
