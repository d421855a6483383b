"""kvscope: step through a language model's decoding, one token at a time. Run: streamlit run app.py"""

from ui.page import main

main()
