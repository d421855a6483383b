"""kvscope: step through a language model's decoding, one token at a time. Run: streamlit run serve.py (it serves
this page; `streamlit run app.py` works too, without `ui.host.streamlit_internals.run_unknown_fragments_whole` for
pages open across a server restart)."""

import sys

import streamlit as st

if "ui.page.main" not in sys.modules:  # a server's first view imports torch and the engine: seconds of blank page
    from ui.text import strings

    starting = st.empty()
    starting.info(strings.t("starting", st.query_params.get("lang", "en")))
    from ui.page.main import main

    starting.empty()
else:
    from ui.page.main import main

main()
