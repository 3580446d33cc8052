"""The browser dashboard (Plotly Dash): a recorded or live run, page by page.

``server.create_app`` builds the app; every figure is read through ``db``
(``db.queries``); ``figures`` turns query results into Plotly figures (pure
functions, shared with the HTML report); ``table_filter`` filters and sorts
the requests table; ``layout`` and ``callbacks`` wire them. Pages with a
module of their own: ``watch_page`` (a ``kvscope watch`` run),
``long_context_page`` (InfLLM retrievals, drawn by ``infllm_figures``) and
``sizing_page`` (``kvscope calc cliff``).
"""
