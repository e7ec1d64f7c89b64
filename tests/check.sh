#!/usr/bin/env bash
# `trainer check`: one step of the same model in two layouts, compared tensor by tensor.
#   tests/check.sh TRAINER        the CPU layouts the parallel tests prove equal (tp 2 with and
#                                 without sequence parallelism, dp 2 at ZeRO 0 and 3, pp 2,
#                                 tp 2 x pp 2 zb-h1, dp 2 x tp 2 ZeRO-2 untied, a
#                                 Llama shape at tp 2) agree within 1e-5; a run that
#                                 TR_FAULT_PERTURB changes at one layer is named exactly there
#                                 (exit 1); bad layouts and flags get one line and exit 2
#   tests/check.sh TRAINER emu    (the emulated CUDA build) the CPU against cuda,bf16 within the
#                                 bf16 tolerance (also at tp 2), and against cuda,fp32 within
#                                 the fp32 one (1e-5)
set -u
. "$(dirname "$0")/lib.sh"
T="$1"
mode="${2:-cpu}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_env
unset TR_FAULT_PERTURB
GPT=tests/recipes_good/tp_gpt.lua
LLAMA=tests/recipes_good/tp_llama.lua

# check NAME EXPECTED_STATUS ARGS...: the table in $tmp/NAME.out, stderr in $tmp/NAME.err
check() {
    local name=$1 want=$2
    shift 2
    timeout 300 "$T" check "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    local rc=$?
    [ "$rc" -eq "$want" ] && return 0
    bad "$name: exit $rc, expected $want: $(tail -3 "$tmp/$name.err" "$tmp/$name.out" | tr '\n' ' ')"
    return 1
}

# agree NAME ARGS...: exit 0, every row "ok", the layers' outputs down to the head's loss, and
# gradients of as many elements as the model has parameters ($want_elems)
agree() {
    local name=$1
    shift
    check "$name" 0 "$@" || return
    local out="$tmp/$name.out" n_act n_grad elems worst
    n_act=$(grep -c '^activation ' "$out")
    n_grad=$(grep -c '^gradient ' "$out")
    elems=$(awk '$1 == "gradient" { n += $3 * $5 } END { print n + 0 }' "$out")
    worst=$(awk '/^(activation|gradient) /{ if ($6 + 0 > w) w = $6 + 0 } END { print w + 0 }' "$out")
    if grep -q 'FAIL' "$out" || [ "$n_act" -lt 3 ] || ! grep -q '^activation lm_head ' "$out" ||
        [ "$elems" -ne "$want_elems" ]; then
        bad "$name: $n_act activations, gradients of $elems elements (the model has $want_elems), $(tail -1 "$out")"
    else
        ok "$name: $n_act activations and $n_grad gradients agree (largest rel diff $worst)"
    fi
}

# the model's parameter count, from a run's TR_DUMP_PARAMS (4 bytes each)
params_of() {
    TR_DUMP_PARAMS="$tmp/p.params" "$T" run "$@" --steps 1 --eval-every 0 --sample-tokens 0 \
        --peak-gflops 1 --device cpu --out "$tmp/p" --overwrite >"$tmp/p.log" 2>&1 || { echo 0; return; }
    echo $(($(stat -c %s "$tmp/p.params") / 4))
}

if [ "$mode" = emu ]; then
    want_elems=$(params_of $GPT)
    agree cuda_bf16 $GPT --a cpu --b cuda,bf16
    grep -q 'tolerance 0.02' "$tmp/cuda_bf16.out" || bad "cuda_bf16: not the bf16 tolerance"
    agree cuda_fp32 $GPT --a cpu --b cuda,fp32
    agree cuda_tp2 $GPT --a cpu --b cuda,bf16,tp=2
    exit $fail
fi

want_elems=$(params_of $GPT)
[ "$want_elems" -gt 1000 ] || bad "a run of $GPT dumped $want_elems parameters"

# the same layout twice: the same batch and the same bits
check same 0 $GPT --a cpu --b cpu
if awk '/^(activation|gradient) / && $6 != "0" { d = 1 } END { exit d }' "$tmp/same.out"; then
    ok "cpu against cpu: every tensor bitwise equal"
else
    bad "cpu against cpu: a tensor differs: $(grep -v ' 0 *ok' "$tmp/same.out" | sed -n 3p)"
fi

agree tp2 $GPT --a cpu --b cpu,tp=2
agree tp2_sp $GPT --a cpu --b cpu,tp=2,sp
agree dp2 $GPT --a cpu --b cpu,dp=2
# as root, the default launcher works without the caller's OMPI_ALLOW_RUN_AS_ROOT variables
# (mpirun refuses root without both; trainer check sets them for its children)
if [ "$(id -u)" = 0 ]; then
    unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
    agree root_dp2 $GPT --a cpu --b cpu,dp=2
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
agree dp2_zero3 $GPT --a cpu --b cpu,dp=2,zero=3
agree pp2 $GPT --a cpu --b cpu,pp=2
agree tp2_pp2_zbh1 $GPT --a cpu,tp=2 --b cpu,tp=2,pp=2,schedule=zb-h1
want_elems=$(params_of $GPT --set tied=false)
agree untied_dp2_tp2 $GPT --set tied=false --a cpu --b cpu,dp=2,tp=2,sp,zero=2
want_elems=$(params_of $LLAMA)
agree llama_tp2 $LLAMA --a cpu --b cpu,tp=2,sp

# one layer's output scaled by 1 + 1e-3 in the --b run only: named as the first difference,
# every tensor before it agreeing
perturbed() { # name layer args...
    local name=$1 layer=$2
    shift 2
    TR_FAULT_PERTURB=$layer check "$name" 1 "$@" || return
    local out="$tmp/$name.out" first before
    first=$(grep '^first tensor beyond' "$out")
    before=$(awk -v l="$layer" '$1 == "activation" && $2 == l { exit } /FAIL/ { print $2 }' "$out")
    if [[ "$first" == "first tensor beyond 1e-05: activation $layer "* ]] && [ -z "$before" ]; then
        ok "$name: $first"
    else
        bad "$name: expected $layer first, got '$first' ${before:+(earlier: $before)}"
    fi
}
perturbed perturb_attention stack.1.residual0.attention $GPT --a cpu --b cpu,tp=2,sp
perturbed perturb_residual stack.0.residual1 $GPT --a cpu --b cpu,pp=2
perturbed perturb_norm layernorm $GPT --a cpu,dp=2,zero=3 --b cpu
# a tolerance above the perturbation lets it pass
TR_FAULT_PERTURB=stack.0.residual1.mlp check perturb_tol 0 $GPT --a cpu --b cpu --tol 1e-2 &&
    ok "--tol 1e-2 passes a perturbation of 1e-3"

# bad input: one line on stderr, nothing on stdout, exit 2
refused() { # name expected-text args...
    local name=$1 text=$2
    shift 2
    check "$name" 2 "$@" || return
    local n
    n=$(wc -l <"$tmp/$name.err")
    if [ "$n" -eq 1 ] && grep -qF -- "$text" "$tmp/$name.err" && [ ! -s "$tmp/$name.out" ]; then
        ok "$name: $(cat "$tmp/$name.err")"
    else
        bad "$name: expected one line with '$text', got: $(head -c 300 "$tmp/$name.err")"
    fi
}
refused bad_item "unknown item 'gpu'" $GPT --a cpu --b gpu,tp=2
refused bad_number "tp needs an integer from 1 to 4096, got 'two'" $GPT --a cpu --b cpu,tp=two
refused bad_twice "tp is given twice" $GPT --a cpu,tp=2,tp=4 --b cpu
refused bad_bf16_cpu "bf16 needs cuda" $GPT --a cpu,bf16 --b cpu
refused bad_sp "sp (sequence parallelism) needs tp=2" $GPT --a cpu --b cpu,sp
refused bad_zero "zero needs an integer from 0 to 3, got '4'" $GPT --a cpu --b cpu,zero=4
refused bad_schedule "schedule must be gpipe" $GPT --a cpu --b cpu,pp=2,schedule=2f2b
refused bad_empty "an empty item" $GPT --a cpu,,tp=2 --b cpu
refused no_b "no --b LAYOUT given" $GPT --a cpu
refused bad_tol "--tol needs a non-negative number, got 'tiny'" $GPT --a cpu --b cpu --tol tiny
refused bad_flag "unknown option '--c'" $GPT --a cpu --b cpu --c cpu
refused bad_launcher "must hold {n}" $GPT --a cpu --b cpu,dp=2 --launcher mpirun

# a layout the model refuses: its own line, naming the side, before any process starts (on a
# machine with fewer cores than the side's processes, without oversubscription, mpirun's help
# page stood in for it); an unknown layer to perturb: the run's own line, exit 2
keep=${OMPI_MCA_rmaps_base_oversubscribe-unset}
unset OMPI_MCA_rmaps_base_oversubscribe
refused model_refuses "trainer check: --b cpu,tp=3: $GPT:10: attention: tp 3 does not divide heads 4" \
    $GPT --a cpu --b cpu,tp=3
[ "$keep" = unset ] || export OMPI_MCA_rmaps_base_oversubscribe=$keep
TR_FAULT_PERTURB=stack.9.mlp check bad_perturb 2 $GPT --a cpu --b cpu &&
    if grep -q "TR_FAULT_PERTURB: no layer output is named 'stack.9.mlp'" "$tmp/bad_perturb.err"; then
        ok "an unknown TR_FAULT_PERTURB layer is refused"
    else
        bad "bad_perturb: $(head -c 400 "$tmp/bad_perturb.err")"
    fi
exit $fail
