"""Clover and Medusa from the same text (app.same_point): the common points of two
traces of one greedy text, and the sentence on what differs."""
from __future__ import annotations

from app import run_handler, same_point, step_view
from clover.trace import StepTrace, TreeNode

TEXT = [" the", " cat", " sat", " on", " the", " mat", "."]  # the one greedy text


def step(i: int, start: int, accepted: int, extra: dict[int, str] | None = None) -> StepTrace:
    """Step ``i`` starting after ``start`` tokens of TEXT: a chain of ``accepted`` correct
    drafts, then ``extra`` wrong drafts {depth: text} under the accepted path's end (or
    deeper, as a chain), and the target's bonus token."""
    root = TEXT[start - 1] if start else "?"
    nodes = [TreeNode(0, 1000, root, -1, 0, 1.0, 1.0)]
    for d in range(1, accepted + 1):
        nodes.append(TreeNode(d, start + d, TEXT[start + d - 1], d - 1, d, 0.6, 0.9))
    parent = accepted
    for d, text in sorted((extra or {}).items()):
        nodes.append(TreeNode(len(nodes), 900 + d, text, parent, d, 0.3, 0.01))
        parent = len(nodes) - 1
    n = accepted + 1
    return StepTrace(step=i, nodes=nodes, accepted=list(range(accepted + 1)),
                     bonus_token=start + n, bonus_text=TEXT[start + n - 1],
                     new_tokens=list(range(start + 1, start + n + 1)), accepted_length=n,
                     draft_ms=2.0, verify_ms=8.0, total_tokens=start + n,
                     new_text=TEXT[start:start + n])


# Clover: 0 -> 3 -> 5 -> 6 -> 7 tokens; Medusa: 0 -> 2 -> 3 -> 6 -> 7 (common starts 0, 3, 6)
CLOVER = [step(0, 0, 2, {3: " ran"}), step(1, 3, 1), step(2, 5, 0), step(3, 6, 0)]
MEDUSA = [step(0, 0, 1, {2: " dog"}), step(1, 2, 0), step(2, 3, 2), step(3, 6, 0)]
RUNS = {"ar": [], "clover": CLOVER, "medusa": MEDUSA}


def test_the_traces_tell_one_text():
    for steps in (CLOVER, MEDUSA):
        assert [t for s in steps for t in s.new_text] == TEXT


def test_the_same_point_is_the_steps_start_or_the_nearest_earlier_common_one():
    p = same_point.same_point(RUNS, "clover", 0)
    assert (p.clover_step, p.medusa_step, p.tokens, p.exact) == (0, 0, 0, True)
    p = same_point.same_point(RUNS, "clover", 1)  # Clover's step 2 starts at 3: so does Medusa's 3
    assert (p.clover_step, p.medusa_step, p.tokens, p.exact) == (1, 2, 3, True)
    p = same_point.same_point(RUNS, "clover", 2)  # starts at 5: no Medusa step does; back to 3
    assert (p.clover_step, p.medusa_step, p.tokens, p.exact) == (1, 2, 3, False)
    p = same_point.same_point(RUNS, "medusa", 1)  # Medusa's step at 2: back to 0
    assert (p.clover_step, p.medusa_step, p.tokens, p.exact) == (0, 0, 0, False)
    p = same_point.same_point(RUNS, "ar", 99)  # plain on display: Clover's last step
    assert (p.clover_step, p.medusa_step, p.tokens) == (3, 3, 6)
    assert same_point.same_point({"clover": CLOVER}, "clover", 0) is None


def test_the_pair_follows_the_method_on_display():
    both = ["clover", "medusa", "clover2", "clover+lookup", "medusa+lookup", "ar"]
    assert same_point.pair_for("clover2", both) == ("clover2", "medusa")
    assert same_point.pair_for("medusa+lookup", both) == ("clover+lookup", "medusa+lookup")
    assert same_point.pair_for("lookup", both) == ("clover", "medusa")
    assert same_point.pair_for("clover+lookup", ["clover", "medusa"]) == ("clover", "medusa")
    assert same_point.pair_for("clover", ["clover", "ar"]) is None


def test_the_sentence_names_what_the_regressive_input_changed():
    text = same_point.describe(same_point.same_point(RUNS, "clover", 0), RUNS)
    assert "Clover drafted 3 tokens and had **2** accepted" in text
    assert "Medusa drafted 2 and had **1** accepted" in text
    # depth 2: Clover read its own depth-1 draft; Medusa's head guessed " dog"
    assert "At depth 2 the target wanted “␣cat”" in text
    assert "its own depth-1 draft “␣the”" in text and "“␣dog”" in text
    later = same_point.describe(same_point.same_point(RUNS, "clover", 2), RUNS)
    assert later.startswith("After 3 tokens") and "nearest point" in later
    assert "Medusa drafted “␣on”" not in later and "Clover's tree drafted nothing there" in later
    tie = same_point.describe(same_point.same_point(RUNS, "clover", 3), RUNS)
    assert "neither tree had drafted there" in tie


def test_the_page_shows_both_trees_titled_by_method():
    st = run_handler.RunState("clover", runs=RUNS, done=True)
    clover_fig, medusa_fig, sentence = step_view.same_point_view(st, "clover", 0)
    assert clover_fig.layout.title.text.startswith("<b>Clover</b>")
    assert medusa_fig.layout.title.text.startswith("<b>Medusa</b>")
    assert "At depth 2" in sentence
    note, _, empty = step_view.same_point_view(
        run_handler.RunState("clover", runs={"clover": CLOVER}, done=True), "clover", 0)
    assert empty == "" and "Compare" in note.layout.annotations[0].text
