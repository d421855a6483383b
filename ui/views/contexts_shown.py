"""What the KV view's "one token, two contexts" part and its lesson chapter show: the page language's sentence pair
(the article's 苹果 in 我吃苹果 and 苹果手机; in English " apple" in "I ate an apple" and "My apple phone", one
token in both on SmolLM2 and Gemma 3), the token's K and V in every layer of both (`engine.context_kv`, through the
page's runner), and the numbers the text quotes, read from the very cosines the figure draws."""

from __future__ import annotations

from dataclasses import dataclass

from engine.context_kv import TokenInContexts
from engine.errors import InvalidSettingError
from ui.views.context import ViewContext


@dataclass
class ContextsShown:
    first: str
    second: str
    word: str
    both: TokenInContexts

    def facts(self) -> dict:
        """The numbers the part's and the chapter's text quote, by the names their templates use."""
        both = self.both
        keys, values, unrotated = both.key_cosines(), both.value_cosines(), both.unrotated_key_cosines()
        content = unrotated or keys  # the keys as their content differs: before RoPE where the model has it
        later = range(1, len(keys))
        k_low = min(later, key=lambda i: content[i]) if later else 0
        v_low = min(later, key=lambda i: values[i]) if later else 0
        out = dict(
            ctx_first=self.first,
            ctx_second=self.second,
            ctx_word=self.word,
            ctx_id=both.token_id,
            ctx_p1=both.positions[0],
            ctx_p2=both.positions[1],
            ctx_k0=keys[0],
            ctx_v0=values[0],
            ctx_k_low=content[k_low],
            ctx_k_low_layer=k_low,
            ctx_v_low=values[v_low],
            ctx_v_low_layer=v_low,
            ctx_k_last=content[-1],
            ctx_v_last=values[-1],
            ctx_last_layer=len(keys) - 1,
            ctx_rope=unrotated is not None,
        )
        if unrotated is not None:
            out.update(ctx_k0_unrotated=unrotated[0])
        return out


def shown_contexts(ctx: ViewContext) -> ContextsShown:
    """The page language's pair on the page's model (raises InvalidSettingError where the word is not one run of
    tokens ending on the same id in both)."""
    first, second, word = (ctx.t(key) for key in ("contexts_first", "contexts_second", "contexts_word"))
    return ContextsShown(str(first), str(second), str(word), ctx.runner.token_in_contexts(first, second, word))


def contexts_facts(ctx: ViewContext) -> dict:
    """The fixed-weights chapter's numbers: its figure's own; none where the pair cannot run on this model (the part
    says why, and the chapter's placeholders stay unfilled)."""
    try:
        return shown_contexts(ctx).facts()
    except InvalidSettingError:
        return {}
