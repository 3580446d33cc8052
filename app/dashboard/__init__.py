"""The browser dashboard (Plotly Dash): a recorded or live run, page by page.

``server.create_app`` builds the app; every figure is read through ``db``
(``db.queries``); ``figures`` turns query results into Plotly figures (pure
functions, shared with the HTML report); ``table_filter`` filters and sorts
the requests table; ``layout`` and ``callbacks`` wire them.
"""
