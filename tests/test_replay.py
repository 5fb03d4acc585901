"""Greedy replay (clover.replay) takes exactly the engine's steps."""
from __future__ import annotations

import pytest
import torch

from clover import Engine, new_heads, parse_tree_spec
from clover.replay import replay_greedy
from conftest import perturb, tiny_target


@pytest.mark.parametrize("kind", ["medusa", "clover", "clover2"])
def test_replay_takes_the_engines_steps(kind):
    """Replaying a head drafter over the plain greedy answer, with the states of one
    target forward over prompt + answer, drafts the engine's trees and accepts what the
    engine accepts, step for step."""
    target = tiny_target("llama")
    heads = perturb(new_heads(kind, target, num_heads=3), scale=0.2, seed=1)
    tree = parse_tree_spec("dynamic:budget=6,branching=2")
    best = 0
    for prompt in ([5, 9, 14, 9, 22, 31, 5, 9], [5, 6, 7, 8, 9] * 3):
        answer = Engine(target).generate(prompt, 24).token_ids
        run = Engine(target, heads, tree).generate(prompt, 24)
        assert run.token_ids == answer
        with torch.no_grad():
            pre, post = target.hidden_states(torch.tensor([prompt + answer], device=target.device))
        steps = replay_greedy(heads.drafter(target, tree), prompt, answer, pre[0], post[0])
        assert [s.accepted for s in steps] == [len(s.accepted) - 1 for s in run.steps]  # the trace counts the root
        assert [s.tree.tokens.tolist() for s in steps] == [[n.token_id for n in s.nodes] for s in run.steps]
        assert sum(s.accepted + 1 for s in steps) == len(answer)
        best = max(best, *(s.accepted for s in steps))
    assert best > 0  # these random heads get some drafts accepted: the replay follows them


def test_replay_refuses_bad_input():
    target = tiny_target("llama")
    heads = new_heads("medusa", target, num_heads=2)
    drafter = heads.drafter(target, parse_tree_spec("chain2"))
    with pytest.raises(ValueError, match="at least one token"):
        replay_greedy(drafter, [], [5])
    with pytest.raises(ValueError, match="cover 3 positions"):
        replay_greedy(drafter, [1, 2], [3, 4], torch.zeros(3, 64), torch.zeros(3, 64))


def test_greedy_answers_are_plain_greedy_and_cached(tmp_path):
    """greedy_answers gives each prompt's plain greedy answer, keyed and cached: a second
    call with the same prompts never builds the target; other prompts do."""
    from clover.models import encode_prompt
    from clover.replay import greedy_answers

    target = tiny_target("llama")
    prompts = [{"category": "qa", "turns": ["t5 t9 t14 t9", "later turn"]},
               {"category": "code", "turns": ["t22 t31 t5"]}]
    cache = tmp_path / "answers.json"
    runs = greedy_answers(target, prompts, 12, cache, progress=False)
    assert [r[0] for r in runs] == ["qa", "code"]
    for (_, ids, answer), p in zip(runs, prompts):
        assert ids == encode_prompt(target.tokenizer, p["turns"][0])
        assert answer == Engine(target).generate(ids, 12).token_ids and len(answer) == 12

    def no_target():
        raise AssertionError("the cached answers should have been used")

    assert greedy_answers(no_target, prompts, 12, cache, progress=False) == runs
    with pytest.raises(AssertionError, match="cached answers"):
        greedy_answers(no_target, prompts[:1], 12, cache, progress=False)  # another key
