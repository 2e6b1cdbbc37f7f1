# Generates access.log: nginx combined, 30 minutes of a small shop's
# traffic with a scraper, a password guesser and a burst of searches.
import random, datetime, gzip
random.seed(17)
start = datetime.datetime(2026, 11, 23, 14, 0, 0, tzinfo=datetime.timezone.utc)
users = ["198.51.100.%d" % i for i in range(2, 80)] + ["2001:db8:%x::1" % i for i in range(1, 12)]
uas = ["Mozilla/5.0 (X11; Linux x86_64) Firefox/132.0", "Mozilla/5.0 (Macintosh) Safari/605.1.15", "curl/8.5.0"]
pages = ["/", "/products", "/products/42", "/cart", "/about", "/api/orders", "/search?q=boots"]
lines = []
def add(t, ip, method, path, status, ua):
    ts = t.strftime("%d/%b/%Y:%H:%M:%S +0000")
    lines.append((t, '%s - - [%s] "%s %s HTTP/1.1" %d %d "-" "%s"' % (ip, ts, method, path, status, random.randint(200, 9000), ua)))
for s in range(30 * 60):
    t = start + datetime.timedelta(seconds=s)
    for _ in range(random.randint(0, 3)):
        add(t, random.choice(users), "GET", random.choice(pages), 200, random.choice(uas))
    # the scraper: 4 pages a second from 14:10 to 14:16
    if 600 <= s < 960:
        for _ in range(4):
            add(t, "203.0.113.66", "GET", "/products/%d" % random.randint(1, 5000), 200, "python-requests/2.32")
    # a password guesser, one attempt every 3 seconds for 10 minutes
    if 300 <= s < 900 and s % 3 == 0:
        add(t, "192.0.2.14", "POST", "/login", 401, "Mozilla/5.0 (Windows NT 10.0)")
    # a few honest logins
    if s % 97 == 0:
        add(t, random.choice(users), "POST", "/login", 302, random.choice(uas))
    # someone hammering search
    if 1200 <= s < 1260:
        add(t, "198.51.100.23", "GET", "/search?q=shoe%d" % s, 200, uas[0])
lines.sort(key=lambda x: x[0])
out = [l for _, l in lines]
out.insert(50, 'GET / HTTP/1.1')  # a line that is not combined: counted and reported
with gzip.open("access.log.gz", "wt") as f:
    f.write("\n".join(out) + "\n")
print(len(out), "lines")
