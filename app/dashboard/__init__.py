"""The browser dashboard (Plotly Dash): a recorded or live run, page by page.

``server.create_app`` builds the app; ``data`` reads the database through
``db.queries``; ``figures`` turns query results into Plotly figures (pure
functions, shared with the HTML report); ``layout`` and ``callbacks`` wire them.
"""
