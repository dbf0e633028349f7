"""The hf generation backend: KV-cache sampling, behaviour log-probs equal to the trainer's recompute,
eos handling and masks, batching invariance, weight loading; the registry and the vllm guard."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from hetprof.errors import ExecutionError, SpecError
from hetprof.executor.backends import GenerationBackend, available_backends, get_backend, register_backend
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.prompts.data import arithmetic_prompts
from hetprof.runtime.sampling import sample_tokens

TOK = CharTokenizer()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return build_causal_lm("tiny", seed=0)


def _prompts(n=6, seed=0):
    # Different lengths on purpose: word problems and bare equations mixed, so rows are left-padded.
    mixed = arithmetic_prompts(n // 2, seed=seed) + arithmetic_prompts(n - n // 2, seed=seed, words=False)
    return [TOK.encode(p.text) for p in mixed]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_recomputed_logprobs(model, temperature):
    gen = get_backend("hf")(model, TOK)
    out = gen.generate(_prompts(), max_new_tokens=12, temperature=temperature,
                       generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        recomputed = token_logprobs(model, out.input_ids, out.attention_mask, temperature=temperature)
    mask = out.shifted_mask.bool()
    assert mask.sum() > 0
    diff = (recomputed - out.shifted_logprobs)[mask].abs().max()
    assert diff < 1e-4, f"generator and trainer disagree by {diff}"
    assert (out.shifted_logprobs[~mask] == 0).all()


def test_rollout_layout_and_masks(model):
    prompts = _prompts()
    out = get_backend("hf")(model, TOK).generate(prompts, 10, generator=torch.Generator().manual_seed(0))
    width = max(len(p) for p in prompts)
    assert out.prompt_width == width and out.input_ids.shape == (6, width + 10)
    for row, p in enumerate(prompts):
        assert out.input_ids[row, width - len(p):width].tolist() == p
        assert out.attention_mask[row, :width].sum() == len(p)
    assert torch.equal(out.response_mask[:, width:], out.attention_mask[:, width:])
    assert out.response_mask[:, :width].sum() == 0
    assert out.lengths.tolist() == out.response_mask.sum(1).tolist()
    assert out.num_tokens == int(out.lengths.sum())
    assert [len(r) for r in out.response_ids()] == out.lengths.tolist()


def test_eos_ends_a_row_and_padding_follows():
    # A zero final norm makes every logit 0: uniform sampling, so <eos> (1 in 64) ends many rows early.
    model = build_causal_lm("tiny", seed=0)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    gen = get_backend("hf")(model, TOK)
    out = gen.generate(_prompts(16), max_new_tokens=64, generator=torch.Generator().manual_seed(5))
    resp = out.input_ids[:, out.prompt_width:]
    ended = 0
    for row in range(16):
        ids = resp[row].tolist()
        n = int(out.lengths[row])
        if TOK.eos_id in ids:
            ended += 1
            assert ids.index(TOK.eos_id) == n - 1  # eos is the last kept token
            assert bool(out.finished[row])
            assert all(t == TOK.pad_id for t in ids[n:])
            assert out.response_mask[row, out.prompt_width + n:].sum() == 0
        else:
            assert n == resp.shape[1] and not bool(out.finished[row])
    assert ended >= 4
    picked = out.logprobs[out.response_mask.bool()]
    assert torch.allclose(picked, torch.full_like(picked, -math.log(64.0)))


def test_batched_generation_equals_one_prompt_at_a_time(model):
    prompts = _prompts(4, seed=3)
    gen = get_backend("hf")(model, TOK)
    batched = gen.generate(prompts, 8, temperature=0.0)
    for row, p in enumerate(prompts):
        alone = gen.generate([p], 8, temperature=0.0)
        n = int(alone.lengths[0])
        assert batched.response_ids()[row] == alone.response_ids()[0]
        assert torch.allclose(batched.logprobs[row, batched.prompt_width:batched.prompt_width + n],
                              alone.logprobs[0, alone.prompt_width:], atol=1e-4)


def test_sampling_is_reproducible_and_top_p_truncates(model):
    gen = get_backend("hf")(model, TOK)
    a = gen.generate(_prompts(), 6, generator=torch.Generator().manual_seed(9))
    b = gen.generate(_prompts(), 6, generator=torch.Generator().manual_seed(9))
    c = gen.generate(_prompts(), 6, generator=torch.Generator().manual_seed(10))
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)
    greedy = gen.generate(_prompts(), 6, temperature=0.0)
    tiny_p = gen.generate(_prompts(), 6, top_p=1e-6, generator=torch.Generator().manual_seed(3))
    assert torch.equal(greedy.input_ids, tiny_p.input_ids)  # the nucleus is the top token alone
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = {int(sample_tokens(lp, 0.7, torch.Generator().manual_seed(s))) for s in range(200)}
    assert draws == {0, 1}  # 0.5 < 0.7 needs the second token; 0.8 ≥ 0.7 stops there


def test_generation_leaves_training_mode_as_it_was(model):
    model.train()
    get_backend("hf")(model, TOK).generate(_prompts(2), 2, generator=torch.Generator().manual_seed(0))
    assert model.training
    model.eval()


def test_load_weights_copies_in_place_and_refuses_mismatches():
    trainer = build_causal_lm("tiny", seed=1)
    target = build_causal_lm("tiny", seed=2)
    gen = get_backend("hf")(target, TOK)
    params_before = {n: p.data_ptr() for n, p in target.named_parameters()}
    gen.load_weights({f"module.{n}": p.detach() for n, p in trainer.named_parameters()})  # DDP names
    for (n, p), (_, q) in zip(trainer.named_parameters(), target.named_parameters(), strict=True):
        assert torch.equal(p, q), n
        assert q.data_ptr() == params_before[n]  # in place: the engine keeps its buffers
    with pytest.raises(ExecutionError, match="no parameter 'nope'"):
        gen.load_weights({"nope": torch.zeros(1)})
    with pytest.raises(ExecutionError, match="shape"):
        gen.load_weights({"model.norm.weight": torch.zeros(3)})


def test_bad_sampling_settings_are_refused(model):
    gen = get_backend("hf")(model, TOK)
    for kwargs, word in [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1}, "temperature"),
                         ({"top_p": 0.0}, "top_p")]:
        args = {"max_new_tokens": 2, **kwargs}
        with pytest.raises(ExecutionError, match=word):
            gen.generate(_prompts(2), **args)
    with pytest.raises(ExecutionError, match="max_position_embeddings \\(512\\)"):
        gen.generate([[1] * 500], max_new_tokens=20)


def test_registry():
    assert {"hf", "vllm"} <= set(available_backends())
    with pytest.raises(SpecError, match="backend"):
        get_backend("no-such-engine")

    @register_backend("test-echo")
    class Echo(GenerationBackend):
        def generate(self, prompt_ids, max_new_tokens, temperature=1.0, top_p=1.0, generator=None):
            raise NotImplementedError

        def load_weights(self, named_tensors):
            pass

    assert get_backend("test-echo") is Echo
    with pytest.raises(TypeError):
        register_backend("bad")(object)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_backend_without_vllm_says_what_to_do(model):
    with pytest.raises(ExecutionError, match="needs vLLM"):
        get_backend("vllm")(model, TOK)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
                    reason="needs vLLM and a CUDA GPU")
def test_vllm_backend_generates_and_takes_new_weights():  # pragma: no cover - GPU machines only
    model = build_causal_lm("tiny", seed=0, dtype="bf16", device="cuda")
    gen = get_backend("vllm")(model, TOK, device="cuda", gpu_memory_utilization=0.2, dtype="bfloat16")
    out = gen.generate(_prompts(), 8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert out.lengths.min() >= 1 and out.input_ids.shape[0] == 6
    with torch.no_grad():
        recomputed = token_logprobs(model, out.input_ids, out.attention_mask)
    mask = out.shifted_mask.bool()
    assert (recomputed - out.shifted_logprobs)[mask].abs().max() < 0.1  # bf16 kernels differ a little
    other = build_causal_lm("tiny", seed=1, dtype="bf16", device="cuda")
    gen.load_weights(dict(other.named_parameters()))
    gen.weights_arrived()
    greedy = gen.generate(_prompts(), 8, temperature=0.0)
    ref = get_backend("hf")(other, TOK, device="cuda").generate(_prompts(), 8, temperature=0.0)
    assert greedy.response_ids()[0][:2] == ref.response_ids()[0][:2]
    gen.close()


def test_logprob_options_agree_with_the_plain_recompute(model):
    from hetprof.executor.models.logprobs import first_response_column

    out = get_backend("hf")(model, TOK).generate(_prompts(), 6, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain, ent = token_logprobs(model, out.input_ids, out.attention_mask, with_entropy=True)
        start = first_response_column(out.shifted_mask)
        assert start == out.prompt_width - 1
        tail, tail_ent = token_logprobs(model, out.input_ids, out.attention_mask, with_entropy=True,
                                        micro_batch_size=4, from_column=start)
    assert tail.shape == plain.shape
    assert torch.allclose(tail[:, start:], plain[:, start:], atol=1e-5)
    assert torch.allclose(tail_ent[:, start:], ent[:, start:], atol=1e-5)
    assert tail[:, :start].abs().sum() == 0
    assert (ent > 0).all() and (ent <= math.log(64) + 1e-4).all()
    greedy = token_logprobs(model, out.input_ids, out.attention_mask, temperature=0.0)
    assert torch.allclose(greedy, token_logprobs(model, out.input_ids, out.attention_mask))
