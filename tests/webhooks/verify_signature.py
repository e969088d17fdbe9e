"""Checks one saved webhook delivery with the standardwebhooks package (PyPI), as a receiver would.

Usage: verify_signature.py DELIVERY_FILE, with the secret (whsec_...) in WEBHOOK_SECRET. The file holds
{"headers": {"name": "value", ...}, "body": "the raw body"}. Prints "verified APPROVAL_ID" and exits 0,
or prints "refused: WHY" and exits 1.
"""

import json
import os
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as file:
        delivery = json.load(file)
    try:
        payload = Webhook(os.environ["WEBHOOK_SECRET"]).verify(delivery["body"], delivery["headers"])
    except WebhookVerificationError as error:
        print(f"refused: {error}")
        return 1
    print(f"verified {payload['approval_id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
