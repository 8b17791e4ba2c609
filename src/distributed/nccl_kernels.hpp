#pragma once
// Internal: the one kernel the NCCL communicator runs itself (nccl_kernels.cu).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace riftco_transformer::distributed_detail {

/// On `stream`: out[i] = ((rows[0][i] + rows[1][i]) + rows[2][i]) + ... for
/// i < m, rows being (world, m) contiguous, then out[i] /= divisor when
/// `divide`: the MPI communicator's rank-order sum (and all_reduce_average's
/// division), element for element, so the same bits. Returns the launch's status.
cudaError_t launch_sum_rows(const float* rows, std::size_t m, int world, bool divide, float divisor, float* out,
                            cudaStream_t stream);

}  // namespace riftco_transformer::distributed_detail
