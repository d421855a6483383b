"""The words: every string the page shows, in each language (`strings`, from strings.csv), and user or model text
made safe inside Streamlit Markdown (`safe`)."""
