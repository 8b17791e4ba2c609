#pragma once
// Large host blocks (>= 64 KiB, whole pages) for the CPU caching allocator
// (src/tensor/memory.cpp): mapped with mmap, kept when freed, recycled across
// sizes, and never more of them held than the most ever live at once.
// Policy and reasons: the comment block in host_page_cache.cpp.
#include <cstddef>
#include <cstdint>

namespace riftco_transformer::detail {

/// A block of `bytes` (a multiple of the page size). Throws std::bad_alloc
/// when the system has no memory for it (the cached blocks are given back
/// and the mapping tried once more first).
void* host_pages_allocate(std::size_t bytes);
/// Keeps the block for reuse (its pages stay resident).
void host_pages_free(void* ptr, std::size_t bytes) noexcept;
/// Unmaps every cached block and restarts the high-water mark at the live
/// block bytes; returns the bytes unmapped.
std::int64_t host_pages_release() noexcept;
/// Bytes mapped: live blocks plus cached ones.
std::int64_t host_pages_reserved() noexcept;

}  // namespace riftco_transformer::detail
