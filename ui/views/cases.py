"""The article's prefix-cache cases: one cached prompt and two edits of it (Case 1 extends it, Case 2 changes
its end). Opening a case publishes the cached prompt alone (`Runner.publish_alone`), then runs the edit."""

CASE_CACHED = "解释什么是Transformer"
CASES = {"case1": "解释什么是Transformer，举个例子", "case2": "解释什么是大语言模型"}
CASE_PROMPTS = {CASE_CACHED, *CASES.values()}
CASE_BLOCK_SIZE = 4  # the cached prompt is 11 tokens: blocks of 16 would hide what the block policy reuses
