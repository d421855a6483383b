"""A chapter opens at the top of the page, its figure on the first screen, however far down the last one was scrolled.

Streamlit keeps the main area's scroll from run to run: a teacher who had scrolled to the whole view of one chapter
and pressed PageUp / PageDown saw the next one from the middle (its title and figure above the screen). The page's
link names the chapter (written once the chapter is drawn), so a link whose chapter changed scrolls the main area back
to its top; a step, a setting or a reload does not.
"""

from __future__ import annotations

import streamlit as st

# Run once per page (Streamlit runs an st.html script again when it draws the element anew).
SCRIPT = """<script>
(() => {
  if (window.kvscopeChapterTop) return;
  window.kvscopeChapterTop = true;
  const chapter = () => new URL(location.href).searchParams.get("chapter");
  let shown = chapter();
  for (const name of ["pushState", "replaceState"]) {
    const write = history[name].bind(history);
    history[name] = (...args) => {
      write(...args);
      const now = chapter();
      if (now !== shown && now) document.querySelector('[data-testid="stMain"]')?.scrollTo(0, 0);
      shown = now;
    };
  }
})();
</script>"""
HIDDEN = '<style>[data-testid="stLayoutWrapper"]:has(> .st-key-kv-chapter-top) { display: none; }</style>'  # no gap


def open_chapters_at_the_top() -> None:
    """Put the script in the page, in a container taken out of the layout."""
    with st.container(key="kv-chapter-top"):
        st.html(HIDDEN + SCRIPT, unsafe_allow_javascript=True)
