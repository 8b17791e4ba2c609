#pragma once
// The distributed layer (DESIGN.md): a communicator over the ranks of a job,
// with a single-process implementation (the default; every collective is the
// identity), an MPI one (built when CMake finds MPI; RIFTCO_MPI=AUTO/ON/OFF)
// and an NCCL one for CUDA tensors (RIFTCO_NCCL=AUTO/ON/OFF, with CUDA).
// Collectives are deterministic: every sum is taken in rank order
// (((x_0 + x_1) + x_2) + ...), so results are bit-identical on every rank and
// from run to run. docs/distributed.md says how, and what happens on failure.
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer {

/// A collective started without waiting for it (Communicator::start_*).
/// Its buffer must stay alive and untouched until wait() returned or test()
/// returned true. Destroying an unfinished request abandons it: its buffers
/// are kept (never freed) because MPI may still write into them, and the
/// ranks are out of step, so the job must end.
class CollectiveRequest {
 public:
  virtual ~CollectiveRequest() = default;
  /// Advances the collective without blocking; true once it is complete.
  virtual bool test() = 0;
  /// Blocks until complete. Bounded: after RIFTCO_MPI_WAIT_TIMEOUT seconds
  /// (RIFTCO_NCCL_WAIT_TIMEOUT for the NCCL communicator; default 600)
  /// without completion, a CommunicationError naming the collective and the
  /// rank (the other ranks did not take part).
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This process's rank, 0 .. world_size() - 1.
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// "single-process", "mpi" or "nccl".
  virtual std::string_view kind() const = 0;
  /// Whether the tensor collectives below take tensors on `backend` at any
  /// world size without a copy to the host: the CPU for every communicator,
  /// CUDA for the NCCL one. (At world size 1 every communicator takes any
  /// backend: each collective is then a copy on the tensor's own backend.)
  virtual bool accepts(Backend backend) const { return backend == Backend::Cpu; }

  /// In place: values[i] = sum over ranks r in rank order of rank r's values[i].
  /// Every rank must pass the same number of elements.
  virtual void all_reduce_sum(std::span<float> values) = 0;
  /// all_reduce_sum, then each element divided by world_size().
  void all_reduce_average(std::span<float> values);
  /// all_reduce_sum without waiting: the same bits once the request
  /// completes (non-blocking MPI_Ialltoallv / MPI_Iallgatherv, the rank-order
  /// sum taken by test()/wait()). Every rank must start the same collectives
  /// in the same order. This default runs all_reduce_sum now and returns a
  /// completed request (the single-process communicator: the identity).
  virtual std::unique_ptr<CollectiveRequest> start_all_reduce_sum(std::span<float> values);
  /// Rank r receives output[i] = sum over ranks (rank order) of
  /// input[r * output.size() + i]; input.size() must be world_size() * output.size().
  virtual void reduce_scatter_sum(std::span<const float> input, std::span<float> output) = 0;
  /// output[r * input.size() + i] = rank r's input[i]; output.size() must be
  /// world_size() * input.size().
  virtual void all_gather(std::span<const float> input, std::span<float> output) = 0;
  /// Every rank's values become rank `root`'s values.
  virtual void broadcast(std::span<float> values, int root) = 0;
  virtual void barrier() = 0;
  /// Ends the whole job now: prints "[riftco rank R/N] message" on stderr and
  /// makes every rank exit non-zero (MPI_Abort); the single-process
  /// implementation prints the message and calls std::_Exit(code).
  [[noreturn]] virtual void abort(std::string_view message, int code = 1) = 0;

  /// The same collectives over tensors, with the same bits. CPU tensors take
  /// the span path above. A tensor on another backend stays there: the NCCL
  /// communicator runs the collective on the device (accepts()), any
  /// communicator at world size 1 copies on the device, and otherwise it is
  /// a BackendError naming the collective, the communicator and the backend
  /// (never a silent copy through the host). Undefined tensors and operands
  /// on different backends are BackendErrors. In-place ones bump the
  /// tensor's version.
  void all_reduce_sum(Tensor& tensor);
  void all_reduce_average(Tensor& tensor);
  void reduce_scatter_sum(const Tensor& input, Tensor& output);
  void all_gather(const Tensor& input, Tensor& output);
  void broadcast(Tensor& tensor, int root);
  /// start_all_reduce_sum over a tensor (the same dispatch); the tensor must
  /// stay alive and untouched until the request completes.
  std::unique_ptr<CollectiveRequest> start_all_reduce_sum(Tensor& tensor);

  /// The job's communicator: the MPI one when riftco was built with MPI and
  /// the process was started by an MPI launcher (mpirun / mpiexec set
  /// OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE), the single-process one
  /// otherwise. MPI is initialized on the first call (MPI_Init_thread,
  /// MPI_THREAD_FUNNELED) and finalized at exit.
  static Communicator& world();
  /// The job's communicator for a model whose parameters live on `backend`
  /// (communicator_kind_for says which): world() for CPU models; for CUDA
  /// models under an MPI launcher, an NCCL communicator over world()
  /// (created on the first call, collective, one CUDA device per rank), and
  /// a BackendError when this build has no NCCL; without a launcher the
  /// single-process one (every collective a copy on the device).
  static Communicator& world_for(Backend backend);

 protected:
  /// The tensor collectives for a defined tensor on a backend other than
  /// the CPU, sizes already checked (operands on one backend). The defaults
  /// copy on the device at world size 1 and throw a BackendError otherwise;
  /// the NCCL communicator overrides them. `average`: divide by world_size().
  virtual void device_all_reduce(Tensor& tensor, bool average);
  virtual std::unique_ptr<CollectiveRequest> device_start_all_reduce_sum(Tensor& tensor);
  virtual void device_reduce_scatter_sum(const Tensor& input, Tensor& output);
  virtual void device_all_gather(const Tensor& input, Tensor& output);
  virtual void device_broadcast(Tensor& tensor, int root);
};

/// A communicator for one process alone: rank 0 of 1, every collective the
/// identity (after the same size checks as the MPI one).
std::unique_ptr<Communicator> make_single_process_communicator();

/// Whether this build of riftco has the MPI communicator.
bool mpi_built();

/// Whether this build of riftco has the NCCL communicator (RIFTCO_NCCL).
bool nccl_built();

/// An NCCL communicator over the ranks of `host` (collective: every rank of
/// `host` calls it). Rank r of `host` is NCCL rank r; it takes the CUDA
/// device of its local rank (its position among the ranks on its host,
/// found by gathering host names over `host`), and every rank fails alike
/// (a BackendError naming the host, its ranks and its devices) when a host
/// has more ranks than CUDA devices. The ncclUniqueId is broadcast from
/// rank 0 over `host`. CUDA tensors go over NCCL on a dedicated stream;
/// host spans go over `host`, so they keep its bits. `host` must outlive
/// the result. A BackendError when this build has no NCCL (nccl_built()).
/// docs/distributed.md, "NCCL".
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host);

/// Which communicator a job uses for a model on `model_backend`, by the
/// rules of Communicator::world_for: "single-process", "mpi" or "nccl".
/// `launched_by_mpi`: an MPI launcher started the process. A BackendError
/// for a CUDA model under a launcher in a build with MPI but without NCCL
/// (its gradients would otherwise cross the host), naming what is missing.
std::string_view communicator_kind_for(Backend model_backend, bool launched_by_mpi, bool mpi_is_built,
                                       bool nccl_is_built);

}  // namespace riftco_transformer
