"""The lesson: its chapters (lesson.toml, read by `chapters`), the panel that draws a chapter with the loaded model's
numbers (`panel`), the facts those numbers come from per view (`eviction_facts`, `serving_facts`), and a chapter
opened at the top of the page (`chapter_top`)."""
