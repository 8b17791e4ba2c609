#include "host_page_cache.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <vector>

// ---- large host blocks ------------------------------------------------------
// A training step frees its activations during backward and then allocates
// gradients of other sizes; zero_grad frees the gradients and the next
// forward asks for activation sizes again. Blocks kept per size only hold
// both sets (reserved ≈ activations + gradients, and the resident set with
// it); handed back to glibc they stay resident anyway (its heap keeps pages
// below its dynamic mmap threshold) or, unmapped, fault in again, zeroed by
// the kernel, every step (~8% of a step).
//
// So every block is a page mapping of its own (mmap: munmap really returns its
// pages), and the bytes held — live blocks plus cached ones — never exceed
// the most block bytes ever live at once (`high_water`, restarted by
// host_pages_release). A freed block is always kept. A request is served by
//   1. a cached block of exactly its size (no system call);
//   2. a new mapping, while live + cached + request stays within the bound;
//   3. otherwise the head of the smallest larger cached block (its tail stays
//      cached as a block of its own: no system call, no page fault);
//   4. otherwise a new mapping into which up to 8 cached blocks (the largest
//      first) are moved with mremap(MREMAP_FIXED): page-table entries move,
//      resident pages are neither copied nor zeroed nor faulted again; only
//      a shortfall is new pages, and cached blocks beyond the bound are
//      unmapped.
// In a repeated step the same pages therefore pass from activations to
// gradients and back: on S3 the resident set follows the allocator's peak
// and a measured step faults ~170 pages (growing one cached block with
// mremap instead of moving several: ~44,000, i.e. 170 MiB a step).
// A freed block is joined with the cached blocks right before and after it
// in the address space (all pages of ours): a head given back and its cached
// tail are one block again. Without that, a pattern like rt-eval's (two
// large blocks fill the bound, smaller requests take heads of them, the large
// size comes back) split a block and moved its pieces together again every
// cycle: 20,014 mremaps, 27 s of system time in one run. Pieces still apart
// (a live block between them) are moved as above.
// Moved pieces stay separate kernel mappings; limit_mappings() keeps them
// far from the per-process limit.
//
// Every mapping is private and anonymous; a block's pages may hold an earlier
// block's data (callers assume nothing about a new block's contents).

namespace riftco_transformer::detail {
namespace {

struct Block {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

struct PageCache {
  std::mutex lock;
  std::map<std::size_t, std::vector<void*>> free_lists;  // block bytes → blocks (no empty lists)
  std::map<char*, std::size_t> by_address;                // the same blocks: start → bytes
  std::int64_t live = 0;        // bytes of blocks handed out (or being mapped)
  std::int64_t cached = 0;      // bytes on the free lists
  std::int64_t high_water = 0;  // most `live` since start or the last release
  std::atomic<std::int64_t> reserved{0};  // live + cached, read without the lock
  std::atomic<std::int64_t> assemblies{0};  // blocks made of moved pieces
};

/// Every this many assembled blocks the process's mapping count is checked.
constexpr std::int64_t kMappingCheckEvery = 256;

PageCache& page_cache() {
  static PageCache cache;
  // fork() copies only the calling thread: the lock is held across it, so
  // that no other thread holds it then (the child would wait forever).
  static const int fork_guard = pthread_atfork([] { cache.lock.lock(); }, [] { cache.lock.unlock(); },
                                               [] { new (&cache.lock) std::mutex(); });
  (void)fork_guard;
  return cache;
}

std::int64_t as_signed(std::size_t bytes) { return static_cast<std::int64_t>(bytes); }

std::size_t page_round(std::size_t bytes) {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

void* map_pages(std::size_t bytes) noexcept {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

std::atomic<HostPagesMove> g_move{nullptr};

/// Moves `bytes` of pages from `from` to `to` (which the kernel unmaps
/// first); MAP_FAILED when it does not.
void* move_pages(void* from, std::size_t bytes, void* to) noexcept {
  if (const HostPagesMove move = g_move.load(std::memory_order_relaxed)) return move(from, bytes, to);
  return mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to);
}

void unmap_pages(Block b) noexcept {
  if (b.bytes > 0) munmap(b.ptr, b.bytes);
}

/// Blocks to unmap once the lock is released.
struct Unmaps {
  std::vector<Block> blocks;
  void add(Block b) noexcept {
    try {
      blocks.push_back(b);
    } catch (...) {
      unmap_pages(b);  // no memory for the list: unmap now, under the lock
    }
  }
  void flush() noexcept {
    for (const Block& b : blocks) unmap_pages(b);
    blocks.clear();
  }
  ~Unmaps() { flush(); }
};

// The helpers below run under c.lock.

/// Puts a block on the free lists; false when that needs memory there is none of.
bool keep(PageCache& c, Block b) noexcept {
  const auto at = c.by_address.find(static_cast<char*>(b.ptr));  // none: blocks never overlap
  std::map<char*, std::size_t>::iterator entry;
  try {
    entry = c.by_address.emplace_hint(at, static_cast<char*>(b.ptr), b.bytes);
  } catch (...) {
    return false;
  }
  try {
    c.free_lists[b.bytes].push_back(b.ptr);
  } catch (...) {
    c.by_address.erase(entry);
    if (const auto list = c.free_lists.find(b.bytes); list != c.free_lists.end() && list->second.empty()) {
      c.free_lists.erase(list);
    }
    return false;
  }
  c.cached += as_signed(b.bytes);
  return true;
}

Block take(PageCache& c, std::map<std::size_t, std::vector<void*>>::iterator it) noexcept {
  const Block b{it->second.back(), it->first};
  it->second.pop_back();
  if (it->second.empty()) c.free_lists.erase(it);
  c.by_address.erase(static_cast<char*>(b.ptr));
  c.cached -= as_signed(b.bytes);
  return b;
}

/// Takes the cached block that starts at `ptr` (of `bytes`).
Block take_at(PageCache& c, char* ptr, std::size_t bytes) noexcept {
  const auto list = c.free_lists.find(bytes);
  auto& blocks = list->second;
  *std::find(blocks.begin(), blocks.end(), static_cast<void*>(ptr)) = blocks.back();
  blocks.pop_back();
  if (blocks.empty()) c.free_lists.erase(list);
  c.by_address.erase(ptr);
  c.cached -= as_signed(bytes);
  return Block{ptr, bytes};
}

/// `b` joined with the cached blocks right before and after it in the
/// address space (taken off the free lists): a head handed out and its tail
/// left cached become one block again when the head comes back, instead of
/// staying two pieces that a later request of the whole size would have to
/// move together again (a split and an assembly every cycle).
Block coalesce(PageCache& c, Block b) noexcept {
  char* start = static_cast<char*>(b.ptr);
  const auto next = c.by_address.find(start + b.bytes);
  if (next != c.by_address.end()) b.bytes += take_at(c, next->first, next->second).bytes;
  const auto after = c.by_address.lower_bound(start);
  if (after != c.by_address.begin()) {
    const auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      const Block p = take_at(c, prev->first, prev->second);
      b.ptr = p.ptr;
      b.bytes += p.bytes;
    }
  }
  return b;
}

/// Unmaps cached blocks until `request` more live bytes fit under the bound:
/// the smallest block that suffices, else the largest, repeatedly.
void release_to_bound(PageCache& c, std::int64_t request, std::int64_t bound, Unmaps& unmaps) noexcept {
  while (c.live + c.cached + request > bound && !c.free_lists.empty()) {
    const auto excess = static_cast<std::size_t>(c.live + c.cached + request - bound);
    auto it = c.free_lists.lower_bound(excess);
    unmaps.add(take(c, it != c.free_lists.end() ? it : std::prev(c.free_lists.end())));
  }
}

/// Takes a cached block of at least `bytes` from `it`; what it has beyond
/// them stays cached as a block of its own (its tail).
Block take_head(PageCache& c, std::map<std::size_t, std::vector<void*>>::iterator it, std::size_t bytes,
                Unmaps& unmaps) noexcept {
  Block b = take(c, it);
  if (b.bytes > bytes) {
    const Block tail{static_cast<char*>(b.ptr) + bytes, b.bytes - bytes};
    if (!keep(c, tail)) unmaps.add(tail);
    b.bytes = bytes;
  }
  return b;
}

/// Cached blocks whose pages are moved into one new block (a fixed few: each
/// moved piece is one more kernel mapping).
struct Pieces {
  static constexpr std::size_t kMost = 8;
  std::array<Block, kMost> blocks{};
  std::size_t count = 0;
};

/// Takes up to Pieces::kMost cached blocks holding up to `bytes` between
/// them: the largest first, then for what is left the smallest that covers
/// it (its head) or again the largest.
void gather(PageCache& c, std::size_t bytes, Pieces& pieces, Unmaps& unmaps) noexcept {
  std::size_t gathered = 0;
  while (gathered < bytes && pieces.count < Pieces::kMost && !c.free_lists.empty()) {
    const std::size_t need = bytes - gathered;
    auto it = c.free_lists.lower_bound(need);
    const Block b = take_head(c, it != c.free_lists.end() ? it : std::prev(c.free_lists.end()), need, unmaps);
    pieces.blocks[pieces.count++] = b;
    gathered += b.bytes;
  }
}

/// Lines of /proc/self/maps: the kernel mappings this process has; -1 when
/// unreadable.
std::int64_t mapping_count() noexcept {
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buffer[16384];
  std::int64_t lines = 0;
  ssize_t n = 0;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) lines += std::count(buffer, buffer + n, '\n');
  close(fd);
  return lines;
}

/// A quarter of the kernel's per-process mapping limit (vm.max_map_count,
/// 65530 by default).
std::int64_t mapping_budget() noexcept {
  std::int64_t limit = 65530;
  if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    long long v = 0;
    if (std::fscanf(f, "%lld", &v) == 1 && v > 0) limit = v;
    std::fclose(f);
  }
  return limit / 4;
}

/// New pages at `at`, only where nothing is mapped (MAP_FIXED_NOREPLACE; a
/// kernel before 4.17 takes the address as a hint): false when something is.
bool map_pages_at(char* at, std::size_t bytes) noexcept {
  void* p = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == at) return true;
  if (p != MAP_FAILED) munmap(p, bytes);
  return false;
}

/// One block of `bytes` made of the pieces' pages: a new mapping with every
/// piece moved into it (mremap with MREMAP_FIXED moves page-table entries:
/// their resident pages are neither copied nor faulted in again); a shortfall
/// is new pages. A piece the kernel will not move (one spanning several
/// mappings, before Linux 6.17) is unmapped and new pages take its place.
/// Null (every piece unmapped) when there is no memory for the mapping.
///
/// A failed move may have unmapped its target first, and another thread's
/// mmap may have been given that hole since: the new pages go there only
/// while nothing is mapped there (never MAP_FIXED), and when something is —
/// another thread's mapping, or still this one's pages when the move failed
/// before unmapping them (which cannot be told apart) — the hole is left
/// alone and only the rest of the block unmapped (at worst a range of
/// untouched pages, no resident memory, stays mapped).
void* assemble(const Pieces& pieces, std::size_t bytes) noexcept {
  char* base = static_cast<char*>(map_pages(bytes));
  std::size_t offset = 0;
  for (std::size_t i = 0; i < pieces.count; ++i) {
    const Block b = pieces.blocks[i];
    if (base == nullptr) {
      unmap_pages(b);
    } else if (move_pages(b.ptr, b.bytes, base + offset) == MAP_FAILED) {
      unmap_pages(b);
      if (!map_pages_at(base + offset, b.bytes)) {
        unmap_pages(Block{base, offset});
        unmap_pages(Block{base + offset + b.bytes, bytes - offset - b.bytes});
        base = nullptr;
      }
    }
    offset += b.bytes;
  }
  return base;
}

/// Unmaps every cached block; `restart` also restarts the high-water mark at
/// the live bytes. Returns the bytes unmapped.
std::int64_t unmap_cached(PageCache& c, bool restart) noexcept {
  std::map<std::size_t, std::vector<void*>> lists;
  {
    std::lock_guard<std::mutex> guard(c.lock);
    lists.swap(c.free_lists);
    c.by_address.clear();
    c.cached = 0;
    if (restart) c.high_water = c.live;
    c.reserved.store(c.live);
  }
  std::int64_t released = 0;
  for (const auto& [bytes, blocks] : lists) {
    for (void* p : blocks) unmap_pages(Block{p, bytes});
    released += as_signed(bytes * blocks.size());
  }
  return released;
}

/// Moved pieces stay separate kernel mappings (areas of different origin do
/// not merge), so a long run could approach the per-process limit, past which
/// every mmap — thread stacks, glibc's — fails. Past a quarter of it the
/// cached blocks are unmapped (a step's worth of page faults, once), and the
/// blocks mapped next are whole again.
std::int64_t mapping_budget_once() noexcept {
  static const std::int64_t budget = mapping_budget();
  return budget;
}

void limit_mappings(PageCache& c) noexcept {
  if (c.assemblies.fetch_add(1) % kMappingCheckEvery == kMappingCheckEvery - 1 &&
      mapping_count() > mapping_budget_once()) {
    unmap_cached(c, false);
  }
}

// The function-local statics above are made while the library loads, before
// any thread of ours: a fork() in one thread while another was inside their
// first use left the child waiting forever on the initialisation guard (and
// without the fork handlers, not yet registered).
[[maybe_unused]] const bool g_initialised_at_load = [] {
  page_cache();
  page_round(1);
  mapping_budget_once();
  return true;
}();

}  // namespace

void* host_pages_allocate(std::size_t requested) {
  PageCache& c = page_cache();
  const std::size_t bytes = page_round(requested);
  const std::int64_t r = as_signed(bytes);
  Unmaps unmaps;
  Pieces pieces;  // 4: cached blocks whose pages make up this one
  {
    std::lock_guard<std::mutex> guard(c.lock);
    const std::int64_t bound = std::max(c.high_water, c.live + r);
    const bool room = c.live + c.cached + r <= bound;
    auto it = c.free_lists.lower_bound(bytes);
    if (it != c.free_lists.end() && (it->first == bytes || !room)) {
      const Block b = take_head(c, it, bytes, unmaps);  // 1: this size, or 3: the head of a larger block
      c.live += r;
      c.high_water = std::max(c.high_water, c.live);
      c.reserved.store(c.live + c.cached);
      return b.ptr;
    }
    if (!room) gather(c, bytes, pieces, unmaps);
    release_to_bound(c, r, bound, unmaps);  // 2; 4 when the pieces fall short
    c.live += r;  // claimed now, so that concurrent requests see it; given back below if mapping fails
    c.reserved.store(c.live + c.cached);
  }
  unmaps.flush();
  void* ptr = nullptr;
  if (pieces.count > 0) {
    ptr = assemble(pieces, bytes);
    limit_mappings(c);
  } else {
    ptr = map_pages(bytes);
  }
  if (ptr == nullptr) ptr = map_pages(bytes);
  std::unique_lock<std::mutex> guard(c.lock);
  if (ptr == nullptr) {
    // Out of memory: the claim is given back before the cached blocks are
    // (their high-water mark restarts at the live bytes, which must not
    // count a request that may fail), then one more try.
    c.live -= r;
    c.reserved.store(c.live + c.cached);
    guard.unlock();
    if (host_pages_release() == 0 || (ptr = map_pages(bytes)) == nullptr) throw std::bad_alloc();
    guard.lock();
    c.live += r;
    c.reserved.store(c.live + c.cached);
  }
  c.high_water = std::max(c.high_water, c.live);
  return ptr;
}

void host_pages_free(void* ptr, std::size_t requested) noexcept {
  PageCache& c = page_cache();
  Block b{ptr, page_round(requested)};
  bool kept = false;
  {
    std::lock_guard<std::mutex> guard(c.lock);
    c.live -= as_signed(b.bytes);
    b = coalesce(c, b);
    kept = keep(c, b);
    c.reserved.store(c.live + c.cached);
  }
  if (!kept) unmap_pages(b);
}

std::int64_t host_pages_release() noexcept { return unmap_cached(page_cache(), true); }

std::int64_t host_pages_reserved() noexcept { return page_cache().reserved.load(); }

HostPagesMove host_pages_set_move(HostPagesMove move) noexcept { return g_move.exchange(move); }

}  // namespace riftco_transformer::detail
