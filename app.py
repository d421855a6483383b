"""kvscope: step through a language model's decoding, one token at a time."""

import streamlit as st

import engine

st.set_page_config(page_title="kvscope", layout="wide")


@st.cache_resource(show_spinner="Loading the model…")
def load(spec: str) -> engine.Model:
    return engine.load_model(spec)


model = load(engine.EMBEDDED)
st.title("kvscope")
st.caption(f"{model.info.name} · {model.info.layers} layers · hidden {model.info.hidden} · vocab {model.info.vocab}")
prompt = st.text_area("Prompt", "What is the capital of France?")
if st.button("Generate"):
    try:
        session = engine.DecodeSession(model, prompt, chat=True, max_new_tokens=48)
        session.prefill()
        while not session.finished:
            session.step()
        with st.container(key="generated"):
            st.text(session.text)
    except engine.KvscopeError as error:
        st.error(str(error))
