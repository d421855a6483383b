"""The host: the limits the server's environment sets (`limits`), its memory kept close to what pages hold
(`memory`), and the private Streamlit internals the app relies on, in one adapter (`streamlit_internals`)."""
