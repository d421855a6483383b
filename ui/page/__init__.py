"""The page: the Streamlit script's entry (`main`), its sidebar and banners, the step's fragment (`step`), the keys
that step and turn chapters, and the model card."""
