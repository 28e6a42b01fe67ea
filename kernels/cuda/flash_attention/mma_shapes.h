// The block shapes of the mma.sync attention kernels (flash_fwd.cu, flash_bwd.cu), as named
// structs, and the one table per kernel that picks a shape for a head dim — the same form as the
// sm_90a kernels' shapes (sm90_shapes.h). A shape is a struct whose static fields name its
// configuration (warps, row blocks per warp, streamed tile, Q in registers, blocks per SM); the
// defaults are in the kernel's base struct (MmaFwdShape, MmaDkdvShape, MmaDqShape), and each shape
// overrides only what differs. The kernels read a shape through their traits (FwdTraits<Shape>,
// BwdTraits<Shape>, kernel_traits.cuh), which derive the sizes and static_assert them.
//
// The mma.sync kernels are chosen by head dim alone (one shape per head dim and kernel, for any
// mask and T), at compile time: the launchers are instantiated per head dim. Each shape's reason,
// with its measurement, is in docs/kernels.md §4.1 (the table there lists them by these names).
//
// Plain C++17 (host and device; no CUDA headers): the launchers and the emulator
// (tools/kernel_emu) read it alike. It includes nothing of sm90_shapes.h, whose text the emulator
// compiles generated (sm90_emu.cuh) beside this header.
#pragma once
#include <type_traits>

namespace tg::cuda::flash {

// ───────────────────────── the fields and their defaults ─────────────────────────
// Every warp owns row_blocks 16-row blocks (one m16n8k16 row block each) of the tile the block
// keeps on chip. With 2, every fragment of a streamed tile a warp loads with ldmatrix feeds two
// mmas (one per row block) instead of one: half the shared-memory bytes per mma and two
// independent mma chains (docs/kernels.md §4.1), which every head dim's forward and dQ use.

// The forward (flash_fwd.cu): a block owns 16 · row_blocks · warps query rows and streams K, V
// tiles of key_tile keys.
struct MmaFwdShape {
  static constexpr int head_dim = 64;
  static constexpr int warps = 4;
  static constexpr int row_blocks = 2;           // 16-row blocks of queries per warp
  static constexpr int key_tile = 64;            // keys per streamed K/V tile (Bc)
  static constexpr bool q_in_registers = true;   // Q's fragments loaded once, else re-read from smem per k-step
  static constexpr int min_blocks = 2;           // blocks per SM the registers must allow (__launch_bounds__)
};

// The backward's two kernels share one form: a block owns 16 · row_blocks · warps rows of two
// tensors and streams tiles of stream_tile rows of two others.
struct MmaBwdShape {
  static constexpr int head_dim = 64;
  static constexpr int warps = 4;
  static constexpr int row_blocks = 2;   // 16-row blocks of owned rows per warp
  static constexpr int stream_tile = 32; // rows per streamed tile
};
// dK/dV (flash_bwd.cu): owns keys (K_j, V_j), streams queries (Q_i, dO_i, their lse and delta).
// atomic_dq: FlashDq::kAtomic permits a run-dependent dQ; it does not require one. Where true,
// kAtomic runs this kernel forming dQ too (5 products per tile pair) and adding it into an fp32
// accumulator; where false (d 96, where that kernel is slower than the deterministic pair at every
// benchmark shape, docs/kernels.md §4.1) the pair serves both modes.
struct MmaDkdvShape : MmaBwdShape {
  static constexpr bool atomic_dq = true;
};
// dQ (flash_bwd.cu): owns queries (Q_i, dO_i), streams keys (K_j, V_j).
struct MmaDqShape : MmaBwdShape {};

// ───────────────────────── the shapes ─────────────────────────
// Head dim 32 (e.g. configs/kjv-tiny.yaml's model, d_model 128 over 4 heads, trained in bf16)
// has these kernels alone, on every GPU; 96 has them on GPUs other than the H100/H200, which run
// it on the d 128 wgmma kernels (wgmma_head_dim). The reasons, with registers, shared memory and
// the measurements, are given at the launch functions (flash_fwd.cu, flash_bwd.cu) and in
// docs/kernels.md §4.1.

// Forward.
struct MmaFwdD32 : MmaFwdShape {  // d 64's tile; 112 long-lived registers let 3 blocks share an SM
  static constexpr const char* name = "mma_fwd_d32";
  static constexpr int head_dim = 32;
  static constexpr int min_blocks = 3;
};
struct MmaFwdD64 : MmaFwdShape {  // Q in registers: 244 registers, 2 blocks/SM
  static constexpr const char* name = "mma_fwd_d64";
  static constexpr int head_dim = 64;
};
struct MmaFwdD96 : MmaFwdShape {  // 64-key tiles 1.109× the 32-key ones; Q from smem to fit 255
  static constexpr const char* name = "mma_fwd_d96";
  static constexpr int head_dim = 96;
  static constexpr bool q_in_registers = false;
};
struct MmaFwdD128 : MmaFwdShape {  // O is 128 registers: Q in registers or 64 keys would pass 255
  static constexpr const char* name = "mma_fwd_d128";
  static constexpr int head_dim = 128;
  static constexpr int key_tile = 32;
  static constexpr bool q_in_registers = false;
};

// dK/dV.
struct MmaDkdvD32 : MmaDkdvShape {  // 4 warps (128 keys) against 2: atomic 1.283×
  static constexpr const char* name = "mma_dkdv_d32";
  static constexpr int head_dim = 32;
};
struct MmaDkdvD64 : MmaDkdvShape {  // 255 registers, 2 blocks/SM
  static constexpr const char* name = "mma_dkdv_d64";
  static constexpr int head_dim = 64;
};
struct MmaDkdvD96 : MmaDkdvShape {  // 6 warps × 16 keys; its atomic kernel 0.77–0.88× the pair
  static constexpr const char* name = "mma_dkdv_d96";
  static constexpr int head_dim = 96;
  static constexpr int warps = 6;
  static constexpr int row_blocks = 1;
  static constexpr bool atomic_dq = false;
};
struct MmaDkdvD128 : MmaDkdvShape {  // dK, dV are 2 × 64 registers per row block: 16 keys per warp
  static constexpr const char* name = "mma_dkdv_d128";
  static constexpr int head_dim = 128;
  static constexpr int row_blocks = 1;
};

// dQ: 4 warps × 32 queries, 32-key tiles at every head dim.
struct MmaDqD32 : MmaDqShape {
  static constexpr const char* name = "mma_dq_d32";
  static constexpr int head_dim = 32;
};
struct MmaDqD64 : MmaDqShape {
  static constexpr const char* name = "mma_dq_d64";
  static constexpr int head_dim = 64;
};
struct MmaDqD96 : MmaDqShape {
  static constexpr const char* name = "mma_dq_d96";
  static constexpr int head_dim = 96;
};
struct MmaDqD128 : MmaDqShape {
  static constexpr const char* name = "mma_dq_d128";
  static constexpr int head_dim = 128;
};

// ───────────────────────── the tables and the selection ─────────────────────────

template <class... S>
struct MmaShapeList {};

using MmaFwdTable = MmaShapeList<MmaFwdD32, MmaFwdD64, MmaFwdD96, MmaFwdD128>;
using MmaDkdvTable = MmaShapeList<MmaDkdvD32, MmaDkdvD64, MmaDkdvD96, MmaDkdvD128>;
using MmaDqTable = MmaShapeList<MmaDqD32, MmaDqD64, MmaDqD96, MmaDqD128>;

// The first shape of a table whose head_dim is D; void if none is.
template <int D, class Table>
struct ShapeForHeadDim {
  using type = void;
};
template <int D, class S, class... Rest>
struct ShapeForHeadDim<D, MmaShapeList<S, Rest...>> {
  using type = std::conditional_t<S::head_dim == D, S, typename ShapeForHeadDim<D, MmaShapeList<Rest...>>::type>;
};

// The selection: head dim → the kernel's shape (every mask and T).
template <int D>
using mma_fwd_shape = typename ShapeForHeadDim<D, MmaFwdTable>::type;
template <int D>
using mma_dkdv_shape = typename ShapeForHeadDim<D, MmaDkdvTable>::type;
template <int D>
using mma_dq_shape = typename ShapeForHeadDim<D, MmaDqTable>::type;

// Whether FlashDq::kAtomic runs the dK/dV kernel forming dQ at head dim D (MmaDkdvShape::atomic_dq).
template <int D>
constexpr bool kMmaSyncAtomicDq = mma_dkdv_shape<D>::atomic_dq;

}  // namespace tg::cuda::flash
