"""The packed small-M GEMM behind `--compile on` on CPU (specpipe.engine.native): exact against a float64
reference for every row count, row block and panel tail, with fp32, bf16 and int8 weights and W8A8
(int8 weights and activations, against the same quantization in float64); batch
invariant bit for bit (a row alone, in a draft of up to 33 rows, among other sessions' rows); threads
change nothing; the integer kernels give the same bits built for any x86 level; a packed model gives
the eager model's logits; no compiler is a clear error."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specpipe.engine import native
from specpipe.engine.models import tiny_model


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def reference(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double()).float()


DTYPES = [torch.float32, torch.bfloat16, torch.int8, torch.uint8, torch.int32]  # uint8: W8A8, int32: W4A8


def packed_in(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """w packed in dtype: (the packed weight, its scales or None, the fp32 weight the kernel multiplies by)."""
    if dtype in native.QUANTIZED:
        q, scale = native.quantize_int8(w)
        return native.pack_weight(q, dtype), scale, q.float() * scale[:, None]
    if dtype == torch.int32:  # Q4_K blocks: the kernel multiplies the values gguf's dequantize gives
        from gguf import GGMLQuantizationType, dequantize

        blocks = native.quantize_q4k(w)
        values = dequantize(blocks, GGMLQuantizationType.Q4_K) if blocks.size else np.zeros(w.shape, np.float32)
        stored = torch.from_numpy(values[:, : w.shape[1]].copy())
        return native.pack_q4k(blocks), None, stored
    return native.pack_weight(w, dtype), None, w.to(dtype).float()  # bf16 weights are exact in fp32


@pytest.mark.parametrize("n, k", [(1, 1), (7, 5), (257, 64), (100, 33), (1536, 96), (50, 1100), (9, 0)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_linear_matches_float64(n, k, bias, dtype):
    torch.manual_seed(n * k)
    w, b = torch.randn(n, k), torch.randn(n) if bias else None
    weight, scale, stored = packed_in(w, dtype)
    assert weight.dtype == dtype
    panels, p = (n + native.panel_width() - 1) // native.panel_width(), native.panel_width()
    kp = native.padded_inputs(k, dtype)
    shapes = {torch.uint8: (panels, kp // 4, p, 4), torch.int32: (panels, kp // native.q4_block(), native.Q4_WORDS, p)}
    assert weight.shape == shapes.get(dtype, (panels, k, p))
    for m in (1, 2, 3, 5, 8, 9, 17, 40):  # one row block, several, and partial ones
        x = torch.randn(m, k)
        expected = reference(quantized_activations(x, dtype) if dtype in native.ROUNDS_ACTIVATIONS else x, stored, b)
        torch.testing.assert_close(native.packed_linear(x, weight, n, b, scale), expected, atol=1e-4, rtol=1e-4)


def quantized_activations(x: torch.Tensor, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """x as the W8A8 (W4A8) kernel multiplies it: each row's blocks of q8_block() (q4_block()) features
    rounded to int8 steps of the block's largest |x| / 127."""
    m, k = x.shape
    block = native.q8_block() if dtype == torch.uint8 else native.q4_block()
    kp = native.padded_inputs(k, dtype)
    blocks = F.pad(x, (0, kp - k)).view(m, kp // block, block)
    largest = blocks.abs().amax(dim=-1, keepdim=True)
    inverse = torch.full_like(largest, 127.0) / largest  # (127 / tensor multiplies by a reciprocal)
    q = torch.round(blocks * torch.where(largest > 0, inverse, 0.0))  # in float32, as the kernel rounds
    return (q.double() * (largest / 127).double()).view(m, kp)[:, :k].float()


def test_w8a8_rounds_each_block_of_a_token_on_its_own_scale():
    """A block of tiny activations keeps its own resolution beside a block of large ones."""
    block = native.q8_block()
    x = torch.cat([torch.full((block,), 1000.0), torch.linspace(-1e-3, 1e-3, block)])[None]
    w = torch.eye(2 * block)
    q, scale = native.quantize_int8(w)
    y = native.packed_linear(x, native.pack_weight(q, torch.uint8), 2 * block, None, scale)
    torch.testing.assert_close(y, x, atol=1e-3 / 127, rtol=0)


def test_w8a8_sums_are_exact_at_the_int8_extremes():
    """Every weight and activation at +-127 (where AVX2's pairwise int16 products would saturate if they
    were taken on w + 128): each output is the signed count of agreeing signs, but for the scales' rounding."""
    torch.manual_seed(0)
    n, k = 96, 4 * native.q8_block()
    w = torch.randint(0, 2, (n, k)).float() * 2 - 1
    x = torch.randint(0, 2, (5, k)).float() * 2 - 1
    q, scale = native.quantize_int8(w)
    assert q.abs().min() == 127
    y = native.packed_linear(x, native.pack_weight(q, torch.uint8), n, None, scale)
    torch.testing.assert_close(y, x @ w.T, atol=1e-3, rtol=1e-6)


def test_w8a8_runs_on_the_cpus_integer_dot_products():
    """The kernel is built for this CPU: its W8A8 sums take AVX-512 VNNI where the CPU has it, else AVX2
    (elsewhere a portable loop, and a W8A8 runner says so); its W4A8 sums AVX-512 VNNI, else AVX2 (an
    AVX-512 host without VNNI runs the AVX2 code)."""
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), None)
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags")
    vnni = "avx512_vnni" in flags and "avx512f" in flags
    expected = "avx512-vnni" if vnni else "avx2" if "avx2" in flags and "avx512f" not in flags else "portable"
    assert native.q8_simd() == expected
    assert native.q4_simd() == ("avx512-vnni" if vnni else "avx2" if "avx2" in flags else "portable")


def repanel(packed: torch.Tensor, n: int, p: int) -> torch.Tensor:
    """W8A8 ([panels, K / 4, P, 4]) or W4A8 ([panels, super-blocks, words, P]) weights packed in panels of one
    width -> panels of p columns."""
    order, inverse = ((0, 2, 1, 3),) * 2 if packed.dtype == torch.uint8 else ((0, 3, 1, 2), (0, 2, 3, 1))
    columns = packed.permute(order)  # [panels, P, ...]
    columns = columns.reshape(-1, *columns.shape[2:])[:n]
    padded = torch.zeros((n + p - 1) // p * p, *columns.shape[1:], dtype=columns.dtype)
    if packed.dtype == torch.uint8:
        padded += 128  # a padding column's weights: 0, stored as w + 128
    padded[:n] = columns
    return padded.view(-1, p, *columns.shape[1:]).permute(inverse).contiguous()


# x86-64 levels the kernel is built for besides -march=native: the CPU flags each needs, and where its W8A8
# and W4A8 sums run (v4, AVX-512 without VNNI: W8A8 the portable loop, W4A8 the AVX2 code over 48-column
# panels; v3: AVX2; x86-64: the portable loops)
X86_LEVELS = {"x86-64-v4": (("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"), {"q8": 0, "q4": 1}),
              "x86-64-v3": (("avx2", "fma", "bmi2"), {"q8": 1, "q4": 1}), "x86-64": ((), {"q8": 0, "q4": 0})}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86 instruction sets")
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32])
def test_integer_kernels_give_the_same_bits_on_every_instruction_set(tmp_path, dtype):
    """The W8A8 and W4A8 sums are exact integers, so the kernel built for AVX-512 without VNNI, for AVX2 and
    for plain x86-64 (the portable loops) gives the bits of this host's build (AVX-512 VNNI where it has
    it): a token's logits do not depend on the machine's vector unit. Levels this CPU cannot run are left out."""
    import ctypes

    from specpipe.engine.native import toolchain

    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    suffix = native.WEIGHT_DTYPES[dtype]
    torch.manual_seed(0)
    n, k = 100, 3 * native.q4_block() - 40
    packed, scale, _ = packed_in(torch.randn(n, k), dtype)
    for march, (needs, simd) in X86_LEVELS.items():
        if not set(needs) <= set(flags):
            continue
        library = tmp_path / f"{march}.so"
        build = [toolchain._compiler(), "-O3", f"-march={march}", "-fPIC", "-shared", "-pthread", str(toolchain.SOURCE)]
        subprocess.run([*build, "-o", str(library)], check=True, capture_output=True)
        lib = ctypes.CDLL(str(library))
        assert getattr(lib, f"specpipe_{suffix}_simd")() == simd[suffix]
        kernel = getattr(lib, f"specpipe_packed_linear_{suffix}")
        kernel.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        words = repanel(packed, n, lib.specpipe_panel_width())
        for m in (1, 3, 9):
            x, b = torch.randn(m, k), torch.randn(n)
            y = torch.empty(m, n)
            scales = None if scale is None else scale.data_ptr()
            assert kernel(x.data_ptr(), m, k, words.data_ptr(), n, scales, b.data_ptr(), y.data_ptr(), 1) == 0
            assert torch.equal(y, native.packed_linear(x, packed, n, b, scale)), (march, m)


HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # bytes of a block's fp16s


@pytest.mark.parametrize("name", sorted(HALF_FIELDS))
def test_gguf_blocks_dequantize_bit_for_bit_as_gguf_does(name):
    """native.dequantize gives gguf.dequantize's values exactly: random blocks, their fp16 scales drawn from
    normal, subnormal, zero and negative values."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

    qtype = GGMLQuantizationType[name]
    values, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (37, 3 * size), dtype=np.uint8)  # 37 rows of 3 blocks
    halves = np.concatenate([rng.standard_normal(200) * 0.05, [0.0, -0.0, 6e-8, -3e-6, 65504.0]]).astype(np.float16)
    for offset in HALF_FIELDS[name]:
        for block in range(3):
            at = block * size + offset
            blocks[:, at : at + 2] = rng.choice(halves, 37).astype(np.float16).view(np.uint8).reshape(37, 2)
    expected = dequantize(blocks, qtype)
    assert expected.shape == (37, 3 * values)
    assert np.array_equal(native.dequantize(blocks, qtype).view(np.uint32), expected.view(np.uint32))


def test_types_it_does_not_read_are_left_to_gguf():
    from gguf import GGMLQuantizationType

    assert native.dequantize(np.zeros((2, 22), np.uint8), GGMLQuantizationType.Q5_0) is None


def test_int8_weights_keep_each_rows_largest_value():
    w = torch.tensor([[0.5, -2.0, 1.0], [0.0, 0.0, 0.0], [3.0, 0.03, -0.01]])
    q, scale = native.quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().amax(dim=1).tolist() == [127, 0, 127]
    torch.testing.assert_close(scale, torch.tensor([2.0 / 127, 1.0, 3.0 / 127]))
    assert (q.float() * scale[:, None] - w).abs().max() <= scale.max() / 2


MAX_DRAFT_ROWS = 33  # [root] + a draft of 32: the most rows a verification feeds one session


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_gets_the_same_bits_alone_in_a_draft_and_among_sessions(dtype, threads):
    """The property that makes speculation lossless on packed weights: a token's output row is the
    same bits when it is computed alone (a decode step, M = 1), at any place in a draft of k rows
    (k = 1..33: one row block, several, partial ones, chunked over K), or in a forward with other
    sessions' rows before and after it."""
    torch.manual_seed(7)
    n, k = 200, 1100  # K > 512: several row blocks take the chunks of K in turn; N not a whole panel
    w, b = torch.randn(n, k), torch.randn(n)
    weight, scale, _ = packed_in(w, dtype)
    rows = torch.randn(MAX_DRAFT_ROWS, k)
    mates = torch.randn(2 * MAX_DRAFT_ROWS, k)
    torch.set_num_threads(threads)
    alone = torch.stack([native.packed_linear(rows[i : i + 1], weight, n, b, scale)[0] for i in range(len(rows))])
    for draft in range(1, MAX_DRAFT_ROWS + 1):
        assert torch.equal(native.packed_linear(rows[:draft], weight, n, b, scale), alone[:draft]), draft
        before = draft % 7  # other sessions' rows around the draft, a different number each time
        batch = torch.cat([mates[:before], rows[:draft], mates[before : before + draft]])
        together = native.packed_linear(batch, weight, n, b, scale)
        assert torch.equal(together[before : before + draft], alone[:draft]), draft


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_invariant_and_thread_invariant(dtype):
    """Each output element is one FMA chain over k: a row's bits do not depend on its batch mates,
    its row block, the chunks of k that several row blocks take in turn (narrow weights widened once
    a chunk there, as they come for one row block), or the thread count."""
    torch.manual_seed(0)
    w, b = torch.randn(300, 1100), torch.randn(300)
    weight, scale, _ = packed_in(w, dtype)
    x = torch.randn(19, 1100)
    torch.set_num_threads(1)
    together = native.packed_linear(x, weight, 300, b, scale)
    for i in range(len(x)):
        assert torch.equal(native.packed_linear(x[i : i + 1], weight, 300, b, scale)[0], together[i])
    torch.set_num_threads(2)
    assert torch.equal(native.packed_linear(x, weight, 300, b, scale), together)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_callers_on_many_threads_at_once_get_the_same_bits(dtype):
    """The kernel's worker pool serves every caller: two roles' forwards at once (the second finds the
    pool busy and runs on its own thread), more threads than cores, and attention beside a GEMM give
    every call the bits of a call alone."""
    torch.manual_seed(3)
    n, k = 300, 1100
    w, b = torch.randn(n, k), torch.randn(n)
    weight, scale, _ = packed_in(w, dtype)
    xs = [torch.randn(m, k) for m in (1, 4, 9)]
    torch.set_num_threads(1)
    expected = [native.packed_linear(x, weight, n, b, scale) for x in xs]
    q, keys, values = torch.randn(4, 3, 16), torch.randn(2, 40, 16), torch.randn(2, 40, 16)
    visible = torch.ones(3, 40, dtype=torch.bool).tril(37)
    attention = native.row_exact_attention(q, keys, values, visible, 0.25)
    torch.set_num_threads(2 * (os.cpu_count() or 1) + 1)
    wrong = []

    def call(times: int) -> None:
        for i in range(times):
            if not torch.equal(native.packed_linear(xs[i % 3], weight, n, b, scale), expected[i % 3]):
                wrong.append(("linear", i))
            if not torch.equal(native.row_exact_attention(q, keys, values, visible, 0.25), attention):
                wrong.append(("attention", i))

    callers = [threading.Thread(target=call, args=(40,)) for _ in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert not wrong


def _forked_child(weight, x, expected, done):
    torch.set_num_threads(2)
    done.put(torch.equal(native.packed_linear(x, weight, 300), expected))


def test_a_forked_child_runs_the_kernel_on_threads():
    """A child forked after the kernel's workers started (a service's worker processes) starts workers
    of its own rather than waiting for its parent's."""
    import multiprocessing

    torch.manual_seed(4)
    weight, x = native.pack_weight(torch.randn(300, 600)), torch.randn(5, 600)
    torch.set_num_threads(2)
    expected = native.packed_linear(x, weight, 300)  # the parent's pool has a worker now
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    child = context.Process(target=_forked_child, args=(weight, x, expected, done))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0 and done.get(timeout=5), "the forked child's kernel call hung or differed"


def test_packed_model_gives_the_eager_logits():
    eager, packed = tiny_model(), tiny_model()
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed.modules())
    assert native.pack_linears(packed) == linears > 0
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    ids = torch.tensor([[5, 17, 99, 3, 250, 8]])
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, eager(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.uint8, torch.int32])
def test_narrow_drafter_weights_stay_close(dtype):
    eager, narrow = tiny_model(), tiny_model()
    native.pack_linears(narrow, dtype)
    ids = torch.tensor([[5, 17, 99, 3, 250, 8]])
    with torch.inference_mode():
        a, b = narrow(ids).logits, eager(ids).logits
    # bf16 keeps 8 bits of mantissa, int8 7 of a row's range; W8A8 rounds the activations to 7 bits of a block's too
    # W4A8's 4-bit steps are ~9x int8's per-row ones on this random model's weights: the bound catches a wrong
    # kernel (off by the logits' whole size), test_packed_linear_matches_float64 its exactness
    assert (a - b).abs().max() < {torch.uint8: 0.08, torch.int32: 0.5}.get(dtype, 0.05) * b.abs().max()
    if dtype not in native.ROUNDS_ACTIVATIONS:  # the random model's logits lie close together: W8A8's (W4A8's)
        # agreement is measured on the real models (bench-results/recipes/weights-agreement.py)
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.uint8, torch.int32])
@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_group_gives_its_layers_bits(bias, dtype):
    """Layers of one input packed side by side (a layer's q/k/v, an MLP's gate and up) run as one GEMM
    with each layer's exact output, panel padding between them included; the layers' own weights
    become views into the group's, so running them one by one gives the same bits, on no more memory."""
    torch.manual_seed(3)
    layers = [native.PackedLinear(torch.nn.Linear(40, n, bias=bias), dtype) for n in (70, 33, 33)]
    x = torch.randn(9, 40)
    alone = [layer(x) for layer in layers]
    assert native.groupable(layers)
    group = native.PackedGroup(layers)
    y = group.bound()(x)
    for (start, width), expected, layer in zip(group.columns, alone, layers):
        assert torch.equal(y[:, start : start + width], expected)
        assert torch.equal(layer(x), expected)
        assert layer.packed.untyped_storage().data_ptr() == group.packed.untyped_storage().data_ptr()
    assert not native.groupable([layers[0], native.PackedLinear(torch.nn.Linear(41, 8, bias=bias))])
    assert not native.groupable([layers[0], native.PackedLinear(torch.nn.Linear(40, 8, bias=not bias))])


def test_packing_a_model_groups_its_projections():
    model = tiny_model()
    native.pack_linears(model)
    for layer in model.model.layers:
        assert isinstance(layer.self_attn.packed_qkv, native.PackedGroup)
        assert isinstance(layer.mlp.packed_gate_up, native.PackedGroup)
    assert native.group_projections(model) == 0  # once


def test_bad_input_is_refused():
    packed = native.pack_weight(torch.randn(4, 8))
    with pytest.raises(ValueError, match="float32 CPU inputs"):
        native.packed_linear(torch.randn(2, 8, dtype=torch.float64), packed, 4)
    with pytest.raises(ValueError, match="the layer takes 8"):
        native.packed_linear(torch.randn(2, 7), packed, 4)
    with pytest.raises(ValueError, match="float32, bfloat16, int8, uint8 .W8A8. or int32"):
        native.pack_weight(torch.randn(4, 8), torch.float16)
    with pytest.raises(ValueError, match=r"int8 \(and W8A8\) packed weights take their scales"):
        native.packed_linear(torch.randn(2, 8), native.pack_weight(torch.zeros(4, 8, dtype=torch.int8), torch.int8), 4)
    with pytest.raises(ValueError, match=r"int8 \(and W8A8\) packed weights take their scales"):
        native.packed_linear(torch.randn(2, 8), packed, 4, scale=torch.ones(4))


def test_no_compiler_is_a_clear_error(tmp_path):
    """A fresh home has no cached build, and CC names no compiler: FAILED_PRECONDITION, said plainly."""
    code = ("from specpipe.engine import native\n"
            "from specpipe.core.errors import FailedPrecondition\n"
            "try:\n    native.build()\nexcept FailedPrecondition as err:\n    print(err)\n")
    env = {**os.environ, "SPECPIPE_HOME": str(tmp_path), "CC": "no-such-cc"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "needs a C compiler" in proc.stdout and "no-such-cc" in proc.stdout, proc.stdout + proc.stderr


def _generate(env_home: str, home: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECPIPE_HOME": env_home, "HOME": home}
    env.pop("SPECPIPE_KERNELS", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "specpipe.cli.main",
            "generate",
            "--preset",
            "tiny",
            "--prompt",
            "hi",
            "--max-new-tokens",
            "4",
            "--json",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow  # builds the kernel afresh and starts three CLI processes
def test_a_read_only_home_builds_the_kernel_elsewhere_or_runs_eager(tmp_path):
    """A models volume mounted read-only (as the manifests do) is no place for the kernel: it goes to
    the user's cache; where nothing is writable, --compile auto runs eager after one warning line and
    --compile on says what to set. Never a traceback. (A path under a file stands for read-only
    storage: tests run as root, whom permission bits do not stop.)"""
    blocked = tmp_path / "file"
    blocked.write_text("")
    read_only_home = str(blocked / "models")
    user_home = tmp_path / "user"
    built = _generate(read_only_home, str(user_home), "--compile", "on", "--verifier-weights", "fp32")  # eager's model
    assert built.returncode == 0, built.stderr
    assert list((user_home / ".cache" / "specpipe" / "kernels").glob("packed_gemm-*.so"))

    eager = _generate(read_only_home, str(blocked / "user"))
    assert eager.returncode == 0 and "Traceback" not in eager.stderr, eager.stderr
    warnings = [line for line in eager.stderr.splitlines() if "--compile auto runs eager forwards" in line]
    assert len(warnings) == 1 and "SPECPIPE_KERNELS" in warnings[0], eager.stderr
    assert json.loads(eager.stdout)["token_ids"] == json.loads(built.stdout)["token_ids"]

    refused = _generate(read_only_home, str(blocked / "user"), "--compile", "on")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "no directory is writable" in refused.stderr and "SPECPIPE_KERNELS" in refused.stderr, refused.stderr


def _tied_model() -> torch.nn.Module:
    """A random 2-layer Qwen2 whose lm_head is its input embedding (tie_word_embeddings, as SmolLM2
    and Qwen2.5-Coder have)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_tied_model_embeds_from_its_packed_lm_head(dtype):
    """Packed, a tied model keeps one copy of its vocabulary's weights: the embedding reads the packed
    lm_head's columns, the fp32 embedding is gone. fp32: the embedding's exact values, so the logits
    stay the eager model's; bf16 / int8: each token's row as the lm_head rounded it (W4A8: the lm_head
    in W8A8, native.head_dtype)."""
    eager, packed = _tied_model(), _tied_model()
    embedding = eager.get_input_embeddings().weight.detach()
    native.pack_linears(packed, dtype)
    embed = packed.get_input_embeddings()
    assert isinstance(embed, native.PackedEmbedding)
    assert embed.packed.data_ptr() == packed.get_output_embeddings().packed.data_ptr()
    assert not any(isinstance(m, torch.nn.Embedding) for m in packed.modules())
    ids = torch.tensor([[0, 5, 17, 31, 32, 33, 299]])  # panel edges on every vector width (P = 16, 32, 48)
    _, _, stored = packed_in(embedding, native.head_dtype(dtype))
    assert torch.equal(embed(ids)[0], stored[ids[0]])
    with torch.inference_mode():
        logits = packed(ids).logits
        if dtype == torch.float32:
            torch.testing.assert_close(logits, eager(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_untied_models_embedding_is_packed_in_narrow_weights(dtype):
    """Untied, the embedding is a table of its own: packed in bf16 or int8 like the linear layers (its
    rows rounded the same way; W4A8's in W8A8), kept fp32 with fp32 weights (the eager model's values)."""
    eager, packed = tiny_model(), tiny_model()
    embedding = eager.get_input_embeddings().weight.detach()
    native.pack_linears(packed, dtype)
    embed = packed.get_input_embeddings()
    ids = torch.tensor([[0, 5, 17, 31, 32, 33, 256]])
    if dtype == torch.float32:
        assert type(embed) is torch.nn.Embedding and torch.equal(embed.weight, embedding)
    else:
        assert isinstance(embed, native.PackedEmbedding)
        assert torch.equal(embed(ids)[0], packed_in(embedding, native.head_dtype(dtype))[2][ids[0]])


def test_row_exact_attention_gives_a_row_its_bits_alone_in_a_draft_and_a_tree():
    """Each query row over exactly its visible keys, in slot order: a token's output is the same bits
    decoded alone, in a chain of drafts, under a tree mask or in a prompt's chunk, with grouped-query
    heads and keys read from a slot's strided view; and it is attention (SDPA's within rounding)."""
    torch.manual_seed(11)
    heads, kv_heads, head_dim, past, n = 6, 2, 40, 37, 9
    slot_k, slot_v = torch.randn(kv_heads, 64, head_dim), torch.randn(kv_heads, 64, head_dim)
    q = torch.randn(heads, n, head_dim)
    scale = head_dim**-0.5

    def attend(rows, visible):  # the rows of q, over the slot's first visible.shape[1] positions
        length = visible.shape[1]
        return native.row_exact_attention(q[:, rows], slot_k[:, :length], slot_v[:, :length], visible, scale)

    causal = torch.ones(n, past + n, dtype=torch.bool)
    causal[:, past:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
    chain = attend(slice(0, n), causal)
    for i in range(n):  # alone: its own position last, everything before it visible
        alone = attend(slice(i, i + 1), torch.ones(1, past + i + 1, dtype=torch.bool))
        assert torch.equal(alone[0], chain[i]), i
    group = heads // kv_heads
    mask = torch.zeros(group * n, past + n).masked_fill_(~causal.repeat(group, 1), -torch.inf)
    sdpa = F.scaled_dot_product_attention(q.reshape(kv_heads, group * n, head_dim)[None], slot_k[None, :, : past + n],
                                          slot_v[None, :, : past + n], attn_mask=mask, scale=scale)
    torch.testing.assert_close(chain, sdpa[0].reshape(heads, n, head_dim).transpose(0, 1).reshape(n, -1))
    tree = causal.clone()  # rows 1 and 2 siblings under row 0: row 2 does not see row 1
    tree[2, past + 1] = False
    sibling = attend(slice(2, 3), torch.cat([torch.ones(1, past + 1, dtype=torch.bool),
                                             torch.tensor([[False, True]])], dim=1))
    assert torch.equal(attend(slice(0, 3), tree[:3, : past + 3])[2], sibling[0])
