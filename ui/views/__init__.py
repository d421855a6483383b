"""One module per view; each has `render(ctx: ViewContext)` and draws with Streamlit only."""
