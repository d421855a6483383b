"""The app's server: `streamlit run serve.py` serves app.py, with what must be in place before the first page.

Streamlit imports this file once when the server starts (an `st.App`), before any browser connects: a step press
from a page that a restarted server has not drawn yet then still counts (`ui.host.streamlit_internals`).
"""

import streamlit as st

from ui.host import streamlit_internals

streamlit_internals.run_unknown_fragments_whole()
app = st.App("app.py")
