"""→ / ← (the step buttons) and PageDown / PageUp (the chapter buttons) work whatever control was clicked last.

Streamlit binds a button's `shortcut` on the document and skips it while the key's target is an <input>,
<textarea> or <select>, as it must for typing. The view radio, the toggles and the sliders are <input>s too, and a
click leaves the focus on them: → then moved the radio to the next view (a slider's thumb; a toggle: nothing)
instead of stepping. So a pointer click on such a control leaves no focus there: the next key reaches the page.
Text boxes (the prompt, number fields, a selectbox being typed in) keep the focus: their arrows move the caret.
A control reached with Tab keeps it too, and its own arrows (a radio's, a slider's): the keyboard still works
every control. Routing the keys to the buttons instead would take those arrows from keyboard users.
"""

from __future__ import annotations

import streamlit as st

# Run once per page (Streamlit runs an st.html script again when it draws the element anew). A click's focus is
# settled after the click's default actions (a label focuses its input), hence the timeout.
SCRIPT = """<script>
(() => {
  if (window.kvscopeKeys) return;
  window.kvscopeKeys = true;
  const NOT_TYPED = new Set(["radio", "checkbox", "range", "button", "submit", "reset", "color", "file", "image"]);
  const CONTROL = "input, select, [role=radio], [role=checkbox], [role=switch], [role=slider], [role=tab]";
  // A selectbox's box keeps the focus when it was the box that was clicked (one types there to filter), not
  // after a click on one of its options.
  const typing = (el, target) => el.isContentEditable || el.tagName === "TEXTAREA" || (el.tagName === "INPUT"
      && !NOT_TYPED.has(el.type) && (el.getAttribute("role") !== "combobox"
                                     || !!el.closest("[data-testid=stElementContainer]")?.contains(target)));
  const release = target => {
    const el = document.activeElement;
    if (el && el.matches(CONTROL) && !typing(el, target)) el.blur();
  };
  const clicked = event => {
    if (event.type === "pointerup" || event.detail > 0) setTimeout(release, 0, event.target);
  };
  document.addEventListener("pointerup", clicked, true);
  document.addEventListener("click", clicked, true);
})();
</script>"""


HIDDEN = '<style>[data-testid="stLayoutWrapper"]:has(> .st-key-kv-keys) { display: none; }</style>'  # no gap


def release_focus_after_clicks() -> None:
    """Put the script in the page, in a container taken out of the layout."""
    with st.container(key="kv-keys"):
        st.html(HIDDEN + SCRIPT, unsafe_allow_javascript=True)
