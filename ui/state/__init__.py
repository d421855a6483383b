"""The page's state: what a link carries (`link.AppState`, parsed and checked), and what one browser session keeps
between script runs (`session`), the one place that reads and writes Streamlit's session state."""
