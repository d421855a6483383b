"""The lesson: its chapters (lesson.toml, read by `chapters`), the article's prefix-cache cases, the panel that
draws a chapter with the loaded model's numbers (`panel`), and the facts those numbers come from per view
(`eviction_facts`, `serving_facts`)."""
