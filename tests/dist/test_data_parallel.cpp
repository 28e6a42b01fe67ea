// Data parallelism, run as every rank of an MPI job (tests/dist/mpirun_test.sh starts it with
// mpirun -np 2 and -np 3; started alone it is world size 1): the collectives against their
// definition, N ranks against one process with the same global batch, ZeRO-1 against ZeRO-0,
// overlapped bucketed reduction against one reduction after the backward, resume across world
// sizes, and a signal reaching one rank only. TILEGRAD_TEST_DEVICE=cuda runs them on the GPU
// (NCCL); the default is the CPU (MPI).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "src/data/prepare.h"
#include "src/interop/hf.h"
#include "src/trainer/trainer.h"
#include "tests/test_util.h"

namespace tg {
namespace {

namespace fs = std::filesystem;

std::string test_device() {
  const char* d = std::getenv("TILEGRAD_TEST_DEVICE");
  return d && *d ? d : "cpu";
}

// The job's ranks, for the tests' own coordination (barriers, agreeing on results).
dist::Communicator& job() {
  static std::unique_ptr<dist::Communicator> comm = [] {
    const dist::Placement p = dist::placement_from_environment();
    return dist::make_communicator(p, resolve_device(test_device(), p.local_rank), 120);
  }();
  return *comm;
}
int W() { return job().world_size(); }
int rank() { return job().rank(); }

// A small corpus per rank (the same tokens everywhere; no file system shared between ranks is
// assumed: only rank 0 reads and writes run directories).
fs::path corpus_dir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tilegrad_dp_test_" + std::to_string(getpid()));
    fs::create_directories(d);
    std::ofstream f(d / "text.txt");
    for (int i = 0; i < 600; ++i) f << "In the beginning " << i % 7 << " the word was " << (i * 13) % 11 << ".\n";
    f.close();
    prepare_text({(d / "text.txt").string()}, (d / "data").string(), 0.1, false);
    return d;
  }();
  return dir;
}

// fp32, dropout on (its masks are keyed by the global row), clipping on.
Config dp_config(const std::string& run_name, int batch_size, int grad_accum) {
  Config c;
  c.run.device = test_device();
  c.model.n_layer = 2; c.model.n_head = 2; c.model.d_model = 32; c.model.max_seq_len = 16;
  c.model.dropout = 0.1;
  c.data.train = (corpus_dir() / "data" / "train_*.bin").string();
  c.data.val = (corpus_dir() / "data" / "val_*.bin").string();
  c.train.batch_size = batch_size; c.train.seq_len = 16; c.train.grad_accum = grad_accum;
  c.train.max_steps = 20; c.train.warmup_steps = 2; c.train.lr = 3e-3; c.train.grad_clip = 1.0;
  c.train.bucket_mb = 0.004;  // a few KiB: many buckets, reduced while the backward runs
  c.run.out_dir = (corpus_dir() / run_name).string();
  c.run.log_every = 100; c.run.eval_every = 10; c.run.eval_steps = 2; c.run.ckpt_every = 0;
  c.run.keep_last = 0; c.run.comm_timeout_s = 60;
  fs::remove_all(c.run.out_dir);
  return c;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> first_grads;  // the reduced gradients of step 1
  std::vector<float> params;       // after the last step
  double val_loss = 0;
};

Outcome train(const Config& c, bool one_process, const std::string& resume = "") {
  Trainer t(c, one_process ? dist::make_single_communicator(resolve_device(c.run.device)) : nullptr);
  Outcome o;
  t.set_gradient_hook([&](int64_t step, nn::ParameterStore& p) {
    if (o.first_grads.empty()) o.first_grads = p.flat_grads().to(Device::cpu()).to_float_vector();
  });
  TrainResult r = t.run(resume);
  o.losses = t.losses();
  o.params = t.model().params().flat_values().to(Device::cpu()).to_float_vector();
  o.val_loss = r.last_val_loss;
  return o;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1e-30, std::abs(b[i])));
  return worst;
}

double rel_norm(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), ref += double(b[i]) * b[i];
  return std::sqrt(diff / std::max(ref, 1e-300));
}

// Every rank holds the same values: their minimum and maximum over the ranks agree.
void expect_same_on_every_rank(const std::vector<double>& v) {
  auto lo = job().all_reduce_values(v, dist::ReduceOp::min, "test: min");
  auto hi = job().all_reduce_values(v, dist::ReduceOp::max, "test: max");
  EXPECT_EQ(lo, hi) << "ranks disagree";
}

TEST(Collectives, ComputeTheirDefinition) {
  const Device dev = resolve_device(test_device(), job().local_rank());
  const int w = W(), r = rank();
  const int64_t n = 6 * w;  // splits into W slices
  std::vector<double> mine(n);
  for (int64_t i = 0; i < n; ++i) mine[size_t(i)] = double(i) + 100.0 * r;  // exact in f32 and f64
  for (DType dt : {DType::f32, DType::f64}) {
    auto buffer = [&] { return Tensor::from_vector(mine, {n}, DType::f64).to(dt).to(dev); };
    auto host = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::f64).to_double_vector(); };
    const double rank_sum = 100.0 * w * (w - 1) / 2;
    Tensor s = buffer();
    job().all_reduce(s, dist::ReduceOp::sum, "test sum");
    Tensor a = buffer();
    job().all_reduce(a, dist::ReduceOp::avg, "test avg");
    Tensor mx = buffer();
    job().all_reduce(mx, dist::ReduceOp::max, "test max");
    Tensor mn = buffer();
    job().all_reduce(mn, dist::ReduceOp::min, "test min");
    Tensor rs = buffer();
    job().reduce_scatter(rs, "test reduce_scatter");
    Tensor ag = buffer();
    job().all_gather(ag, "test all_gather");
    Tensor bc = buffer();
    job().broadcast(bc, w - 1, "test broadcast");
    const auto vs = host(s), va = host(a), vmx = host(mx), vmn = host(mn), vrs = host(rs), vag = host(ag), vbc = host(bc);
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(i);
      EXPECT_EQ(vs[k], w * double(i) + rank_sum) << i;
      EXPECT_DOUBLE_EQ(va[k], double(i) + rank_sum / w) << i;
      EXPECT_EQ(vmx[k], double(i) + 100.0 * (w - 1)) << i;
      EXPECT_EQ(vmn[k], double(i)) << i;
      if (i / 6 == r) EXPECT_EQ(vrs[k], w * double(i) + rank_sum) << "reduce_scatter, my slice, " << i;
      EXPECT_EQ(vag[k], double(i) + 100.0 * double(i / 6)) << "all_gather " << i;  // slice q from rank q
      EXPECT_EQ(vbc[k], double(i) + 100.0 * (w - 1)) << "broadcast " << i;
    }
  }
  EXPECT_TRUE(job().all_agree(true, "test agree"));
  EXPECT_FALSE(job().all_agree(r != w - 1, "test disagree"));
  job().barrier("test barrier");
}

cpu_set_t cpus(std::initializer_list<int> ids) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c : ids) CPU_SET(c, &s);
  return s;
}

// Ranks on one node share out the CPUs their affinity masks hold.
TEST(Launch, CpuRanksShareTheirNodesCpus) {
  const cpu_set_t four = cpus({0, 1, 2, 3}), two = cpus({0, 1}), other_two = cpus({2, 3});
  EXPECT_EQ(dist::cpu_threads_of_share(four, {four}), 4);              // alone on the node
  EXPECT_EQ(dist::cpu_threads_of_share(four, {four, four}), 2);        // two ranks, no binding
  EXPECT_EQ(dist::cpu_threads_of_share(two, {four, four, four}), 1);    // never below one
  EXPECT_EQ(dist::cpu_threads_of_share(two, {two, other_two}), 2);     // bound apart: all of its own
  EXPECT_EQ(dist::cpu_threads_of_share(cpus({0}), {cpus({0}), cpus({0}), cpus({0})}), 1);
  // One rank bound to CPUs 0-1, two unbound over 0-3: the bound one shares 0-1 three ways.
  EXPECT_EQ(dist::cpu_threads_of_share(four, {two, four, four}), 1);   // 2/3 + 1/2 + 1/2 = 1.67
  EXPECT_EQ(dist::cpu_threads_of_share(cpus({0, 1, 2, 3, 4, 5, 6, 7}), {cpus({0, 1, 2, 3, 4, 5, 6, 7}), two}), 7);
}

// One srun task needs no MPI (Open MPI could not start there without PMIx); several tasks
// without an MPI plugin stop before MPI is touched, naming the option that starts them.
TEST(Launch, SrunWithoutPmixIsOneProcessOrAClearError) {
  if (!dist::placement_from_environment().launcher.empty() || std::getenv("PMIX_RANK") || std::getenv("PMI_FD"))
    GTEST_SKIP() << "needs a process started without a launcher (MPI must not be initialised yet)";
  dist::Placement one;
  one.launcher = "srun";
  EXPECT_EQ(dist::make_communicator(one, Device::cpu(), 5)->backend(), "single");
  if (!dist::have_mpi()) return;
  dist::Placement two = one;
  two.world_size = 2;
  try {
    dist::make_communicator(two, Device::cpu(), 5);
    ADD_FAILURE() << "two srun ranks without PMIx started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("srun --mpi=pmix"), std::string::npos) << e.what();
  }
}

// W ranks × batch 2, one process × batch 2 × W micro-batches and one process × batch 2W read
// the same rows with the same dropout masks: the same first gradients (to 1e-6) and losses (to
// 1e-5) over 20 steps; the validation loss, over the same windows, equals the batch-2W run's.
TEST(DataParallel, MatchesOneProcessWithTheSameGlobalBatch) {
  const Outcome ranks = train(dp_config("dp_ranks", 2, 1), false);
  expect_same_on_every_rank(ranks.losses);
  const Outcome one = train(dp_config("dp_one", 2, W()), true);
  EXPECT_LE(rel_norm(ranks.first_grads, one.first_grads), 1e-6);
  EXPECT_LE(max_rel(ranks.losses, one.losses), 1e-5);
  const Outcome wide = train(dp_config("dp_wide", 2 * W(), 1), true);
  EXPECT_LE(rel_norm(ranks.first_grads, wide.first_grads), 1e-6);
  EXPECT_LE(max_rel(ranks.losses, wide.losses), 1e-5);
  EXPECT_LE(std::abs(ranks.val_loss - wide.val_loss) / wide.val_loss, 1e-5);
  ASSERT_EQ(ranks.losses.size(), 20u);
  EXPECT_LT(ranks.losses.back(), ranks.losses.front() - 0.5) << "the model learns";
}

// ZeRO-1 (AdamW's moments sharded, parameters all-gathered) takes the steps ZeRO-0 takes. On two
// ranks an element's sum is one addition in the reduce-scatter and in the all-reduce alike; with
// three, the library may add the three terms in another order in each, and AdamW's division by
// √v carries that last-bit difference into the parameters.
TEST(DataParallel, ZeroOneMatchesZeroZero) {
  Config c0 = dp_config("dp_zero0", 2, 1);
  Config c1 = dp_config("dp_zero1", 2, 1);
  c1.train.zero = 1;
  const Outcome z0 = train(c0, false), z1 = train(c1, false);
  EXPECT_LE(max_rel(z1.losses, z0.losses), 1e-7);
  EXPECT_LE(rel_norm(z1.params, z0.params), W() <= 2 ? 1e-6 : 1e-5);
  expect_same_on_every_rank({z1.params.begin(), z1.params.begin() + 64});
}

// Buckets reduced while the backward runs give what one reduction after it gives.
TEST(DataParallel, OverlappedBucketsMatchOneReductionAfterTheBackward) {
  Config many = dp_config("dp_buckets", 2, 2);
  Config one = dp_config("dp_onebucket", 2, 2);
  one.train.bucket_mb = 0;
  const Outcome a = train(many, false), b = train(one, false);
  // An element's sum over two ranks is one addition whatever the bucketing; with more ranks
  // the library may pick another summation order for another message size.
  if (W() <= 2 && test_device() == "cpu") EXPECT_EQ(a.losses, b.losses);
  EXPECT_LE(max_rel(a.losses, b.losses), 1e-6);
}

// Recomputed blocks in pieces run one backward per piece over the same parameters: a bucket may be
// reduced only once the last piece has added its share, so the overlapped buckets must give what
// one reduction after the backward gives (bitwise on two ranks, as above).
TEST(DataParallel, BlocksInPiecesReduceAfterTheirLastPiece) {
  auto pieces = [](Config c) {
    c.model.dropout = 0.0;  // pieces need it off
    c.train.recompute = true;
    c.train.recompute_rows = 5;  // 16 positions: pieces of 5, 5, 5, 1
    return c;
  };
  Config many = pieces(dp_config("dp_pieces_buckets", 2, 2));
  Config one = pieces(dp_config("dp_pieces_onebucket", 2, 2));
  one.train.bucket_mb = 0;
  const Outcome a = train(many, false), b = train(one, false);
  if (W() <= 2 && test_device() == "cpu") EXPECT_EQ(a.losses, b.losses);
  EXPECT_LE(max_rel(a.losses, b.losses), 1e-6);
}

// bf16 on the GPU: small gradients (biases, LayerNorm weights) reach their fp32 buffer in one
// batched launch after the backward, so a bucket holding them may be reduced only after it. A
// bucket reduced too early would lose them; the sum of two ranks is one addition per element
// whatever the bucketing, so on two ranks the runs are bitwise equal, and they track one process.
TEST(DataParallel, Bf16BucketsWaitForTheLastGradients) {
  if (test_device() != "cuda") GTEST_SKIP() << "bf16 training needs a GPU (TILEGRAD_TEST_DEVICE=cuda)";
  auto bf16 = [](Config c) {
    c.train.precision = "bf16";
    c.model.n_head = 1;  // head dim 32: the fused attention kernels
    return c;
  };
  const Outcome many = train(bf16(dp_config("dp_bf16_buckets", 2, 1)), false);
  Config one_bucket = bf16(dp_config("dp_bf16_onebucket", 2, 1));
  one_bucket.train.bucket_mb = 0;
  const Outcome one = train(one_bucket, false);
  if (W() <= 2) EXPECT_EQ(many.losses, one.losses);
  EXPECT_LE(max_rel(many.losses, one.losses), 1e-3);
  const Outcome alone = train(bf16(dp_config("dp_bf16_alone", 2, W())), true);
  EXPECT_LE(max_rel(many.losses, alone.losses), 2e-2);
  EXPECT_LE(rel_norm(many.first_grads, alone.first_grads), 2e-2);
}

// A checkpoint written by W ranks resumes in one process (with W micro-batches) and one written
// by one process resumes on W ranks; the loss continues as in the straight run.
TEST(DataParallel, ResumesAtAnotherWorldSize) {
  const std::string ckpt_name = "ckpt-10.h5";
  // W → 1.
  Config straight = dp_config("dp_resume_straight", 2, 1);
  straight.run.ckpt_every = 10;
  const Outcome full = train(straight, false);
  if (rank() == 0) {
    Config one = dp_config("dp_resume_to_one", 2, W());
    fs::create_directories(one.run.out_dir);
    fs::copy_file(fs::path(straight.run.out_dir) / ckpt_name, fs::path(one.run.out_dir) / ckpt_name);
    const Outcome resumed = train(one, true, "latest");
    ASSERT_EQ(resumed.losses.size(), 10u);
    EXPECT_LE(max_rel(resumed.losses, {full.losses.begin() + 10, full.losses.end()}), 1e-5);
  }
  job().barrier("test: W → 1 done");
  // 1 → W: rank 0 trains alone and leaves its checkpoint where rank 0 of the W-rank run reads it.
  Config alone = dp_config("dp_resume_alone", 2, W());
  alone.run.ckpt_every = 10;
  Config ranks = dp_config("dp_resume_to_ranks", 2, 1);
  Outcome single;
  if (rank() == 0) {
    single = train(alone, true);
    fs::create_directories(ranks.run.out_dir);
    fs::copy_file(fs::path(alone.run.out_dir) / ckpt_name, fs::path(ranks.run.out_dir) / ckpt_name);
  }
  job().barrier("test: checkpoint of one process written");
  const Outcome resumed = train(ranks, false, "latest");
  if (rank() == 0) {
    ASSERT_EQ(resumed.losses.size(), 10u);
    EXPECT_LE(max_rel(resumed.losses, {single.losses.begin() + 10, single.losses.end()}), 1e-5);
  }
}

// train.init_from in a W-rank run: rank 0 alone reads the folder (the other ranks' path does not
// exist: each rank has its own temp folder) and broadcasts the parameters; the run then tracks
// one process started from the same folder with the same global batch.
TEST(DataParallel, InitFromIsReadByRankZeroAndBroadcast) {
  const std::string hf = (corpus_dir() / "dp_init_hf").string();
  Config one = dp_config("dp_init_one", 2, W());
  one.train.max_steps = 6;
  one.train.init_from = hf;
  Outcome single;
  if (rank() == 0) {
    Config source = dp_config("dp_init_source", 2, 1);
    source.train.max_steps = 3;
    TrainResult r = Trainer(source, dist::make_single_communicator(resolve_device(source.run.device))).run();
    auto [path, data] = resolve_and_load(r.last_checkpoint, "latest");
    fs::remove_all(hf);
    export_hf(data, path, hf, false);
    single = train(one, true);
  }
  job().barrier("test: exported");
  Config ranks = dp_config("dp_init_ranks", 2, 1);
  ranks.train.max_steps = 6;
  ranks.train.init_from = hf;
  const Outcome dp = train(ranks, false);
  double sum = 0;
  for (float v : dp.params) sum += v;
  expect_same_on_every_rank({sum});
  if (rank() == 0) EXPECT_LE(max_rel(dp.losses, single.losses), 1e-5);
}

// A checkpoint written by W ranks and resumed on W ranks continues bit for bit.
TEST(DataParallel, ResumesExactlyAtTheSameWorldSize) {
  Config straight = dp_config("dp_exact_straight", 2, 1);
  straight.train.zero = 1;
  const Outcome full = train(straight, false);
  Config first = dp_config("dp_exact_first", 2, 1);
  first.train.zero = 1;
  {  // interrupted after step 8 (SIGTERM to rank 0: the run checkpoints and stops)
    Trainer t(first);
    t.set_step_hook([&](int64_t step) {
      if (step == 8 && rank() == 0) std::raise(SIGTERM);
    });
    ASSERT_EQ(t.run().final_step, 8);
  }
  const Outcome rest = train(first, false, "latest");
  EXPECT_EQ(rest.losses, std::vector<double>(full.losses.begin() + 8, full.losses.end()));
  EXPECT_EQ(rest.params, full.params);
}

// SIGTERM reaching the last rank alone: every rank stops after the same step, one checkpoint.
// Ranks given another config or other data stop together at the start, before the run's first
// collective of their sizes, the rank that differs naming the first difference. (The paths may
// differ: every rank of these tests reads a corpus folder of its own, as nodes without a shared
// file system would.)
TEST(DataParallel, RanksWithAnotherConfigOrOtherDataStopNamingTheDifference) {
  if (W() == 1) GTEST_SKIP() << "needs several ranks (tests/dist/mpirun_test.sh starts them)";
  const bool odd_one = rank() == W() - 1;
  auto error_of = [](const Config& c) {
    try {
      Trainer(c).run();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  Config c = dp_config("dp_other_config", 2, 1);
  if (odd_one) c.train.batch_size = 3;
  std::string err = error_of(c);
  if (odd_one) EXPECT_NE(err.find("differs from rank 0's, at train.batch_size: 3 (rank 0: 2)"), std::string::npos) << err;
  else EXPECT_NE(err.find("were given different configs or data"), std::string::npos) << err;

  Config d = dp_config("dp_other_data", 2, 1);
  if (odd_one) {
    const fs::path other = corpus_dir() / "other";
    fs::create_directories(other);
    std::ofstream f(other / "text.txt");
    for (int i = 0; i < 500; ++i) f << "Another text " << i % 5 << ".\n";
    f.close();
    prepare_text({(other / "text.txt").string()}, (other / "data").string(), 0.1, false);
    d.data.train = (other / "data" / "train_*.bin").string();
    d.data.val = (other / "data" / "val_*.bin").string();
  }
  err = error_of(d);
  if (odd_one) EXPECT_NE(err.find("differs from rank 0's, at data.train shards: 'train_000000.bin, "), std::string::npos) << err;
  else EXPECT_NE(err.find("were given different configs or data"), std::string::npos) << err;
  // The job goes on: no rank is left waiting in a collective.
  job().barrier("test: after the refused runs");
}

TEST(DataParallel, SignalToOneRankStopsAllAfterTheSameStep) {
  Config c = dp_config("dp_signal", 2, 1);
  Trainer t(c);
  t.set_step_hook([&](int64_t step) {
    if (step == 3 && rank() == W() - 1) std::raise(SIGTERM);
  });
  const TrainResult r = t.run();
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.final_step, 3);
  if (rank() == 0) {
    EXPECT_TRUE(fs::exists(fs::path(c.run.out_dir) / "ckpt-3.h5"));
    EXPECT_EQ(list_checkpoints(c.run.out_dir).size(), 1u);
  }
}

}  // namespace
}  // namespace tg
