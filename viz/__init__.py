"""Pure functions from engine traces to Plotly figures and pandas tables. No model calls, no Streamlit."""
