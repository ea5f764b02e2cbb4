"""The finance dashboard served under `/ui/`: sign-in with the admin key, sessions in an
HttpOnly cookie, and server-rendered pages (Jinja2 templates in `templates/`, one style
sheet in `static/`). The spend chart is SVG drawn here in Python: the pages need no
JavaScript, no chart library and nothing from the network. The HTTP routes are in
gateway/api/ui.py; the figures come from gateway/accounting."""
