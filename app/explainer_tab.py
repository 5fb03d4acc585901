"""The "How Clover works" tab: the architecture diagram and a short explanation of
speculative decoding with draft heads, Medusa and Clover, then a Clover-2 diagram and
what changed from Clover-1, then batched serving with the committed batch-size sweep
(static content: nothing here runs the engine)."""
from __future__ import annotations

import gradio as gr

from clover.assets import assets_dir
from clover.bench import batch_sweep_figure, load_batch_sweep

# under clover.assets_dir(), read when the page is built (never at import)
DIAGRAM_FILE = "figures/clover_vs_medusa.svg"
CLOVER2_DIAGRAM_FILE = "figures/clover2.svg"

EXPLAINER = """
## How Clover works

**The problem.** A language model writes one token per forward pass, and each pass is
dominated by reading the weights from memory, not by arithmetic. On a GPU, checking ten
tokens in one pass costs barely more than producing one; on a CPU the extra tokens cost
more, so the candidate tree has to stay small.

**Speculative decoding with draft heads.** Small *draft heads* read the target model's
own hidden state and guess the next few tokens, as a small *candidate tree* (several
guesses per position). The target then checks the whole tree in **one** forward pass: a
*tree attention mask* lets each candidate see only the prompt and its own ancestors. The
target keeps the longest branch it agrees with and adds one token of its own, the
**bonus token**. The text is exactly what the target alone would have written (greedy:
token for token; sampling: the same distribution); only the number of target passes
shrinks. In the *Decode* tab, green nodes are accepted guesses, the blue star is the bonus
token, and vermillion crosses are rejected guesses.

**Medusa** (the baseline) puts several independent heads on the last hidden state. Head 3
guesses the token three places ahead without knowing what heads 1 and 2 guessed, so its
guesses are often inconsistent with theirs, and deep guesses are rarely accepted.

**Clover** adds *sequential knowledge* with three parts:

- **Regressive Connection.** Each head is told which token was chosen one position
  earlier: the previous head's guess (for the first head, the target's own next token),
  fed in as that token's row of the output layer. A guess can now build on the guesses
  before it, the way the target itself writes.
- **Attention Decoder.** One small attention block, shared by all heads, merges that
  token into the running state: `h_i = h_(i-1) + Attn(query from h_(i-1), key and value
  from the token)`. Each head then has its own small MLP and reuses the target's frozen
  output layer.
- **Augmenting Block.** One extra transformer layer, of the target's own kind and
  initialised from its last layer, runs over the target's hidden states first and gives
  the heads a richer starting state (it keeps its own cache and is used only for
  guessing).

The paper (arXiv 2405.00263) reports 50-76% more extra tokens per step than Medusa and
up to 1.26x (7B model) and 1.47x (over 100B) Medusa's throughput, because the deeper
heads guess much better.
"""

CLOVER2_EXPLAINER = """
## Clover-2: what changed

**Clover-2** (arXiv 2408.00264) is the same authors' successor to Clover. The figure above
marks each change with a numbered outline:

- **The token comes in first.** An Attention Decoder now runs *before* the Augmenting
  Block and merges every position's hidden state with the token that follows it, so the
  extra layers already see the target's newest token.
- **A deeper Augmenting Block**: two transformer layers instead of one, still with their
  own cache and used only for guessing.
- **Simpler heads that share weights.** Each head's small MLP becomes one plain linear
  layer. Head 1 has its own; heads 2 and up share one Attention Decoder and one linear
  layer, which also reads the previous token: the same step repeated, like a recurrent
  network (RNN). Every head still reuses the target's frozen output layer.
- **An extra training signal.** Besides matching the target's next-token probabilities,
  each head's output is pulled towards the target's own hidden state at that position.
- **Why.** The authors added that signal because Clover-1's heads *overfit*: they learn
  their training text too well and guess worse on new text. Our heads for the small
  built-in model learn from a few thousand short answers (the authors used 68,000
  conversations), so overfitting is a real risk here too.
- **In this app** Clover-2 is offered in the *Decode* tab only when trained Clover-2
  heads are available (shipped with the app, or in the heads folder you give).
"""

AT_SCALE_EXPLAINER = """
## At scale: batched serving

The Clover paper measures one regime: a server decoding a *batch* of prompts together,
each with its own candidate tree (Table 1: batch sizes 4 to 48, a token tree of 4
tokens). Speculation pays most at small batches: at batch 4, on math with the 7B model,
Clover is 91% faster than plain decoding (Medusa: 54%). Every method's gain shrinks as
the batch grows, until speculation is slower than plain decoding. Checking extra tokens is free only while
one pass is dominated by reading the weights; once batch size x tree tokens fill the
hardware, each extra token costs real arithmetic, and rejected guesses become waste.

A CPU flattens this further: it has little spare arithmetic even for one prompt, so the
gain is smaller at batch 1 and is used up after a few rows. The figure below is measured
here, with the small built-in model, by the command beneath it (not re-run by the app).
"""

AT_SCALE_MISSING = ("*The batch-size measurement is not committed yet "
                    "(`assets/bench/batch_sweep.json`, see `assets/bench/README.md`).*")


def figure(path) -> str:
    """An SVG file inlined on a white card."""
    return (f"<div style='background:#fff;border-radius:10px;padding:6px'>"
            f"{path.read_text(encoding='utf-8')}</div>")


def sweep_caption(results: dict) -> str:
    """The command that made a committed sweep, and where it ran, in one small line."""
    meta = results["meta"]
    return (f"<small>Measured with `{meta['command']}` ({meta.get('model', '?')} on "
            f"{meta.get('device', '?')}, {meta.get('torch_threads', '?')} threads, "
            f"{meta.get('processor', '?')}).</small>")


def build() -> None:
    """Lay out the tab inside the current ``gr.Tab``: the diagram, then the text; below
    them the Clover-2 diagram and its text; last, batched serving: its text, then the
    committed batch-size sweep (:func:`clover.bench.load_batch_sweep`) as a figure with
    the command that made it, or a one-line note while none is committed."""
    gr.HTML(figure(assets_dir() / DIAGRAM_FILE), elem_id="diagram")
    gr.Markdown(EXPLAINER, elem_id="explainer")
    gr.HTML(figure(assets_dir() / CLOVER2_DIAGRAM_FILE), elem_id="clover2-diagram")
    gr.Markdown(CLOVER2_EXPLAINER, elem_id="clover2-explainer")
    gr.Markdown(AT_SCALE_EXPLAINER, elem_id="at-scale-explainer")
    sweep = load_batch_sweep()
    if sweep is None:
        gr.Markdown(AT_SCALE_MISSING, elem_id="at-scale-missing")
    else:
        gr.Plot(batch_sweep_figure(sweep), elem_id="at-scale-plot")
        gr.Markdown(sweep_caption(sweep), elem_id="at-scale-command")
