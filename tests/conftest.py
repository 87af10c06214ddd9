import logging

logging.getLogger("tidemq").setLevel(logging.DEBUG)
