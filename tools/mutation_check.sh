#!/usr/bin/env bash
# Mutation check: puts deliberate bugs into the core, one at a time, and runs the tests that
# should notice each; every mutation must make its tests fail. A mutation that survives means
# the tests around that code cannot see the bug, which is what this is for.
#
# It works on a scratch copy of the repository (the committed HEAD, or with --worktree the
# working tree's tracked and untracked files), never on the tree itself, with one CPU build
# shared by all mutations: a mutation recompiles its file and relinks the test binaries it needs.
# Each mutation replaces exact, whole source lines; a line that is not found exactly once stops
# the check with an error, so the check cannot silently stop mutating anything when the code
# changes. Before any mutation the same tests must pass on the unmutated copy.
#
# Usage: tools/mutation_check.sh [--worktree] [--only NAME[,NAME…]] [--list] [--keep]
#   --worktree  check the working tree instead of HEAD
#   --only      run only these mutations (names as --list prints them)
#   --keep      keep the scratch directory (printed at the end)
# Environment: JOBS (build jobs, default 2), TEST_TIMEOUT (seconds per test binary run,
# default 600; a run that times out counts as failing), TMPDIR (where the scratch copy goes).
# Exit status: 0 when every mutation is caught; 1 when one survives; 2 when a mutation cannot be
# applied or built, or a test fails without any mutation.
# Takes 7 to 12 minutes on 2 cores, most of it the first build; not part of ./test.sh or ctest.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
use_worktree=0 keep=0 list=0 only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --worktree) use_worktree=1 ;;
    --keep) keep=1 ;;
    --list) list=1 ;;
    --only) only=${2:?--only needs a list of names}; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "mutation_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
jobs=${JOBS:-2}
test_timeout=${TEST_TIMEOUT:-600}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# ---------------------------------------------------------------------------------------------
# The mutations. Each: a name, what it breaks, the tests ("binary:gtest filter", space separated)
# that must fail, and a function making its edits with `edit FILE 'exact line' 'replacement'`.

names=() whats=() tests=()
mutation() { names+=("$1"); whats+=("$2"); tests+=("$3"); }

mutation adamw_no_moments "AdamW keeps no running moments (m = g, v = g²)" \
  "test_optim:AdamW.*"
adamw_no_moments() {
  edit kernels/cpu/adamw.h \
    '    float mi = beta1 * m[i] + (1.0f - beta1) * gi;' \
    '    float mi = gi;'
  edit kernels/cpu/adamw.h \
    '    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;' \
    '    float vi = gi * gi;'
}

mutation adamw_no_bias_correction "AdamW without bias correction" \
  "test_optim:AdamW.*"
adamw_no_bias_correction() {
  edit kernels/cpu/adamw.h \
    '    float mhat = mi / bias_correction1;' \
    '    float mhat = mi;'
  edit kernels/cpu/adamw.h \
    '    float vhat = vi / bias_correction2;' \
    '    float vhat = vi;'
}

mutation clip_never_applied "gradient clipping ignores the norm (factor always 1)" \
  "test_optim:AdamW.Clip*"
clip_never_applied() {
  edit src/optim/adamw.cpp \
    '  return max_norm > 0 && std::isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;' \
    '  return 1.0;'
}

mutation decided_clip_ignored "the step decided on the device ignores the gradient norm when clipping" \
  "test_optim:AdamW.Decided*"
decided_clip_ignored() {
  edit kernels/cpu/adamw.h \
    '  d.clip = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;' \
    '  d.clip = 1.0;'
}

mutation decided_skip_ignored "the step decided on the device updates on a non-finite loss" \
  "test_optim:AdamW.Decided* test_trainer:Trainer.NonFiniteStepsAreSkippedThenTheRunStops"
decided_skip_ignored() {
  edit kernels/cpu/adamw.h \
    '  if (!finite) {' \
    '  if (false) {'
}

mutation resume_resets_bad_steps "a resume starts the count of non-finite steps in a row again" \
  "test_trainer:Trainer.ResumeKeepsTheCountOfBadStepsInARow:Devices/ExactResume.*/cpu*"
resume_resets_bad_steps() {
  edit src/trainer/state.cpp \
    '  s.bad_steps_in_row = get_int(ckpt, "bad_steps_in_row", path);' \
    '  s.bad_steps_in_row = 0 * get_int(ckpt, "bad_steps_in_row", path);'
}

mutation resume_drops_optimizer_steps "a resume restarts AdamW's step count (bias correction from step 1)" \
  "test_trainer:Trainer.ResumeKeepsTheCountOfBadStepsInARow:Devices/ExactResume.*/cpu*"
resume_drops_optimizer_steps() {
  edit src/trainer/trainer.cpp \
    '  opt_->set_steps_taken(optimizer_steps);' \
    '  opt_->set_steps_taken(0);'
}

mutation resume_drops_moments "a resume leaves AdamW's moments at zero" \
  "test_trainer:Trainer.ResumeKeepsTheCountOfBadStepsInARow:Devices/ExactResume.*/cpu*"
resume_drops_moments() {
  edit src/trainer/trainer.cpp \
    '  sync_->take_owned(m, opt_->first_moment());' \
    '  (void)m;'
  edit src/trainer/trainer.cpp \
    '  sync_->take_owned(v, opt_->second_moment());' \
    '  (void)v;'
}

mutation flash_no_rescale "CPU flash attention: accumulator not rescaled when the running max moves" \
  "test_kernels_cpu:*"
flash_no_rescale() {
  edit kernels/cpu/flash_attention.cpp \
    '  for (int64_t d = 0; d < D; ++d) acc_row[d] *= alpha;' \
    '  for (int64_t d = 0; d < D; ++d) acc_row[d] *= T(1);'
}

mutation scale_backward_sign "scale's gradient negated (src/ops)" \
  "test_ops:Ops/OpTable.*/scale"
scale_backward_sign() {
  edit src/ops/basic.cpp \
    '  record(out, "scale", {x}, [s](const Tensor& g) { return std::vector<Tensor>{scale_raw(g, s)}; });' \
    '  record(out, "scale", {x}, [s](const Tensor& g) { return std::vector<Tensor>{scale_raw(g, -s)}; });'
}

mutation layernorm_backward_term "LayerNorm backward without the −norm·mean(dnorm·norm) term" \
  "test_ops:Ops/OpTable.*/layernorm*"
layernorm_backward_term() {
  edit kernels/cpu/layernorm.h \
    '      dxr[c] = (dr[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * rs;' \
    '      dxr[c] = (dr[c] * weight[c] - dnorm_mean) * rs;'
}

mutation checkpoint_crc_skipped "checkpoint loading skips the whole-file CRC-32C comparison" \
  "test_io:Checkpoint.WholeFileChecksumCatchesEveryFlip:Checkpoint.CorruptMetadata*:Checkpoint.FlippedByte*"
checkpoint_crc_skipped() {
  edit src/io/checkpoint.cpp \
    '  TG_CHECK(total == want_size && crc == want, ctx, ": whole-file checksum mismatch (CRC-32C of the file is ", have_hex,' \
    '  TG_CHECK(total == want_size, ctx, ": whole-file checksum mismatch (CRC-32C of the file is ", have_hex,'
}

mutation log_failure_ignored "the trainer trains on after a failed log write" \
  "test_trainer:Robustness.FailedLogWriteEndToEnd*:Robustness.LogWriteOnAFullDisk*"
log_failure_ignored() {
  edit src/trainer/trainer.cpp \
    '    if (any_write_failed) stop_for_write_error(write_failed);' \
    '    if ((false)) stop_for_write_error(write_failed);'
}

mutation graph_despite_dropout "train.cuda_graph records a step whose dropout the host decides" \
  "test_trainer:Trainer.CudaGraphWhereItCannotReplayIsLoggedAndLaunched"
graph_despite_dropout() {
  edit src/trainer/trainer.cpp \
    '  if (cfg.model.dropout > 0) return "model.dropout is " + detail::concat(cfg.model.dropout);' \
    '  if ((false)) return "model.dropout is " + detail::concat(cfg.model.dropout);'
}

mutation embedding_handover_dropped "the embedding's backward takes the tied projection's gradient over and drops it" \
  "test_ops:Ops/OpTable.*/embedding*"
embedding_handover_dropped() {
  edit src/ops/nn_ops.cpp \
    '               if (other.defined()) cpu::add_inplace(gw.data<T>(), other.data<T>(), gw.numel());' \
    '               if ((false)) cpu::add_inplace(gw.data<T>(), other.data<T>(), gw.numel());'
}

mutation add_layernorm_of_an_addend "add_layernorm normalises its first addend instead of the sum" \
  "test_ops:Ops/OpTable.*/add_layernorm"
add_layernorm_of_an_addend() {
  edit src/ops/normalization.cpp \
    '    return {sum, layernorm(sum, weight, bias, eps)};' \
    '    return {sum, layernorm(a, weight, bias, eps)};'
}

mutation host_ids_ignored "the document starts are read back from the device, not taken from the host copy given" \
  "test_nn:GPTMasks.*"
host_ids_ignored() {
  edit src/nn/gpt.cpp \
    '    host_ids = host_ids_.defined() ? host_ids_ : ids.device().is_cpu() ? ids : ids.to(Device::cpu());' \
    '    host_ids = ids.device().is_cpu() ? ids : ids.to(Device::cpu());'
}

if [ "$list" = 1 ]; then
  for i in "${!names[@]}"; do printf '%-30s %s\n' "${names[$i]}" "${whats[$i]}"; done
  exit 0
fi
selected=()
for i in "${!names[@]}"; do
  if [ -z "$only" ] || [[ ",$only," == *",${names[$i]},"* ]]; then selected+=("$i"); fi
done
if [ -n "$only" ]; then
  IFS=, read -r -a wanted <<< "$only"
  for w in "${wanted[@]}"; do
    [[ " ${names[*]} " == *" $w "* ]] || { echo "mutation_check: no mutation named '$w' (see --list)" >&2; exit 2; }
  done
fi

# ---------------------------------------------------------------------------------------------
# The scratch copy and its build.

scratch=$(mktemp -d "${TMPDIR:-/tmp}/tilegrad-mutation.XXXXXX")
cleanup() { if [ "$keep" = 1 ]; then echo "scratch directory kept: $scratch"; else rm -rf "$scratch"; fi; }
trap cleanup EXIT
src=$scratch/src build=$scratch/build logs=$scratch/logs orig=$scratch/orig
mkdir -p "$src" "$logs" "$orig"
commit=$(git -C "$repo" rev-parse --short HEAD)
if [ "$use_worktree" = 1 ]; then
  # (a tracked file deleted in the working tree is left out)
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -x -C "$src"
  dirty=$(git -C "$repo" status --porcelain | wc -l)
  source_desc="working tree at $commit ($dirty changed or untracked paths)"
else
  git -C "$repo" archive HEAD | tar -x -C "$src"
  source_desc="commit $commit"
fi
echo "mutation check of $source_desc in $scratch"

die() { echo "mutation_check: $*" >&2; exit 2; }

# edit FILE OLD NEW: replaces the one line of FILE that is exactly OLD by NEW; an error unless
# exactly one line matches.
edit() {
  local file=$1 path=$src/$1
  [ -f "$path" ] || die "mutation $current: $file does not exist"
  [ -f "$orig/$file" ] || { mkdir -p "$(dirname "$orig/$file")"; cp "$path" "$orig/$file"; }
  edited_files+=("$file")
  local n
  n=$(OLD=$2 NEW=$3 perl -e '
    my ($old, $new, $n) = ($ENV{OLD}, $ENV{NEW}, 0);
    my $path = shift; open(my $in, "<", $path) or die "$path: $!"; my @lines = <$in>; close $in;
    for (@lines) { my $eol = s/(\r?\n)\z// ? $1 : ""; if ($_ eq $old) { $_ = $new; ++$n; } $_ .= $eol; }
    if ($n == 1) { open(my $out, ">", $path) or die "$path: $!"; print $out @lines; close $out; }
    print $n;' "$path") || die "mutation $current: perl failed on $file"
  [ "$n" = 1 ] || die "mutation $current: expected exactly one line of $file to be
    $2
  found $n; the code changed: update the mutation in tools/mutation_check.sh"
}

restore() {
  local f
  for f in "${edited_files[@]}"; do
    cp "$orig/$f" "$src/$f"
    touch "$src/$f"  # newer than the mutant's objects, so the next build recompiles it
  done
  edited_files=()
}

# run_tests LOGPREFIX "bin:filter …": 0 when every run passed (and ran at least one test).
run_tests() {
  local prefix=$1 spec status=0 k=0
  for spec in $2; do
    local bin=${spec%%:*} filter=${spec#*:} log=$prefix.$k.log
    k=$((k + 1))
    if timeout "$test_timeout" "$build/$bin" --gtest_filter="$filter" > "$log" 2>&1 &&
       grep -qE '^\[  PASSED  \] [1-9][0-9]* tests?\.' "$log"; then
      :
    else
      status=1
    fi
  done
  return $status
}

# The test binaries of a test list, and the tilegrad command, which tests run as a program: a
# mutant library must reach it too, or a test of the command would still see the unmutated code.
targets() {
  local spec t="tilegrad"
  for spec in $1; do t="$t ${spec%%:*}"; done
  echo "$t" | tr ' ' '\n' | sort -u | tr '\n' ' '
}

start=$(date +%s)
all_targets=""
for i in "${selected[@]}"; do all_targets="$all_targets $(targets "${tests[$i]}")"; done
all_targets=$(echo "$all_targets" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
echo "configuring and building $all_targets(CPU only, $jobs jobs)…"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTILEGRAD_CUDA=OFF > "$logs/configure.log" 2>&1 ||
  { tail -20 "$logs/configure.log"; die "configuring the scratch copy failed ($logs/configure.log)"; }
# shellcheck disable=SC2086
cmake --build "$build" -j "$jobs" --target $all_targets > "$logs/build.log" 2>&1 ||
  { tail -30 "$logs/build.log"; die "building the unmutated copy failed"; }
echo "built in $(( $(date +%s) - start )) s"

# The focused tests must pass before anything is mutated, or "caught" would mean nothing.
current=baseline
edited_files=()
declare -A baseline_done=()
for i in "${selected[@]}"; do
  spec_list=${tests[$i]}
  [ -n "${baseline_done[$spec_list]:-}" ] && continue
  baseline_done[$spec_list]=1
  if ! run_tests "$logs/baseline.$i" "$spec_list"; then
    for f in "$logs"/baseline."$i".*.log; do tail -15 "$f"; done
    die "the tests of mutation ${names[$i]} fail without any mutation: $spec_list"
  fi
done
echo "baseline: the tests of every mutation pass unmutated ($(( $(date +%s) - start )) s so far)"

rows=() survived=0
for i in "${selected[@]}"; do
  current=${names[$i]}
  t0=$(date +%s)
  edited_files=()
  "${names[$i]}"
  files=$(printf '%s\n' "${edited_files[@]}" | sort -u | tr '\n' ' ')
  # shellcheck disable=SC2046
  if ! cmake --build "$build" -j "$jobs" --target $(targets "${tests[$i]}") > "$logs/$current.build.log" 2>&1; then
    tail -20 "$logs/$current.build.log"
    die "mutation $current does not compile; fix the mutation in tools/mutation_check.sh"
  fi
  if run_tests "$logs/$current" "${tests[$i]}"; then caught=no; survived=$((survived + 1)); else caught=yes; fi
  restore
  secs=$(( $(date +%s) - t0 ))
  echo "  $current: caught=$caught (${secs} s)"
  rows+=("| $current | ${files% } | ${tests[$i]} | $caught | $secs |")
done

echo
echo "Mutation check of $source_desc, $(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - start )) s in all:"
echo
echo "| mutation | file | tests run | caught | seconds |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
if [ "$survived" -gt 0 ]; then
  echo "mutation_check: $survived mutation(s) survived: strengthen the tests that should catch them" >&2
  exit 1
fi
echo "every mutation was caught"
