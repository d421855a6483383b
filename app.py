"""kvscope: step through a language model's decoding, one token at a time. Run: streamlit run app.py"""

import sys

import streamlit as st

if "ui.page" not in sys.modules:  # a server's first view imports torch and the engine: seconds of blank page
    from ui import strings

    starting = st.empty()
    starting.info(strings.t("starting", st.query_params.get("lang", "en")))
    from ui.page import main

    starting.empty()
else:
    from ui.page import main

main()
