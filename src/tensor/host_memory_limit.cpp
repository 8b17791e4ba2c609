// How much host memory this process may use: physical memory, or the cgroup's
// limit or the address-space limit (ulimit -v) when lower. The runs' and the
// planner's up-front memory checks compare their lower bounds with it.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "riftco_transformer/memory.hpp"

namespace riftco_transformer {

double available_host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  double bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  struct rlimit address_space {};  // ulimit -v: the address space this process may map
  if (::getrlimit(RLIMIT_AS, &address_space) == 0 && address_space.rlim_cur != RLIM_INFINITY) {
    const auto as = static_cast<double>(address_space.rlim_cur);
    bytes = bytes > 0 ? std::min(bytes, as) : as;
  }
  std::ifstream limit("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when unlimited
  std::string text;
  if (limit >> text && text != "max") {
    try {
      const double cgroup = std::stod(text);
      if (cgroup > 0) bytes = bytes > 0 ? std::min(bytes, cgroup) : cgroup;
    } catch (const std::exception&) {
    }
  }
  return bytes;
}

}  // namespace riftco_transformer
