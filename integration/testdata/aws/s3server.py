#!/usr/bin/env python3
"""A small S3-compatible endpoint for the broker's AWS tests, checking SigV4 with botocore.

It is not the broker's implementation: header signatures and presigned URLs are recomputed
with botocore's own signer (S3SigV4Auth, S3SigV4QueryAuth) from the request as received and
the real key; aws-chunked chunk and trailer signatures by this file's HMAC chain, from AWS's
description of the format; declared payload hashes and trailing or header checksums against
the bytes received. Objects live in memory; GET of any bucket's key "_echo_request" answers
the request's headers, as an upstream reflecting what it was sent. TLS only, loopback only.

Configuration by environment: S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN
(optional), S3_MORE_KEYS (more keys accepted), S3_REGION, S3_BUCKETS (comma-separated, created empty), S3_CERT, S3_KEY (PEM).
It prints "listening PORT" once it listens on 127.0.0.1, then one JSON line per request:
method, path, auth ("header" or "presigned"), payload (the x-amz-content-sha256 form), status,
error (why it refused, never a secret).
"""
import base64
import binascii
import datetime
import hashlib
import hmac
import json
import os
import ssl
import sys
import threading
import urllib.parse
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

# Accepted keys by id: (secret key, session token). S3_MORE_KEYS, a JSON list of
# {"id", "secret", "token"}, adds keys, so that a test can rotate the broker's.
KEYS = {os.environ["S3_ACCESS_KEY_ID"]: (os.environ["S3_SECRET_ACCESS_KEY"], os.environ.get("S3_SESSION_TOKEN", ""))}
for k in json.loads(os.environ.get("S3_MORE_KEYS", "[]")):
    KEYS[k["id"]] = (k["secret"], k.get("token", ""))
REGION = os.environ.get("S3_REGION", "us-east-1")
EMPTY = hashlib.sha256(b"").hexdigest()
NS = "http://s3.amazonaws.com/doc/2006-03-01/"

lock = threading.Lock()
buckets = {b: {} for b in os.environ.get("S3_BUCKETS", "").split(",") if b}
uploads = {}  # upload id -> (bucket, key, {part number: bytes})
log_lock = threading.Lock()


class Refused(Exception):
    def __init__(self, status, code, msg):
        super().__init__(msg)
        self.status, self.code, self.msg = status, code, msg


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def checksum(alg, data):
    if alg == "crc32":
        return base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    if alg == "crc32c":
        return base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
    if alg == "sha1":
        return base64.b64encode(hashlib.sha1(data).digest()).decode()
    if alg == "sha256":
        return base64.b64encode(hashlib.sha256(data).digest()).decode()
    raise Refused(400, "InvalidRequest", "checksum algorithm %s not supported here" % alg)


def key_for(key_id):
    if key_id not in KEYS:
        raise Refused(403, "InvalidAccessKeyId", "access key id is not one of the root keys")
    return KEYS[key_id]


def signing_key(secret, date):
    k = ("AWS4" + secret).encode()
    for part in (date, REGION, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    entry = None

    def log_message(self, *args):
        pass

    def send_response(self, code, message=None):
        if self.entry is not None:
            self.entry["status"] = code
        super().send_response(code, message)

    def end_headers(self):
        # The log line is written before the client can have the response, so that a test
        # reading the log after a response finds the line.
        if self.entry is not None:
            with log_lock:
                print(json.dumps(self.entry), flush=True)
            self.entry = None
        super().end_headers()

    def do_GET(self):
        self.handle_s3()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    # -- reading -----------------------------------------------------------------------
    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # -- signature checks --------------------------------------------------------------
    def url(self):
        return "https://%s%s" % (self.headers["Host"], self.path)

    def verify_presigned(self, query):
        q = dict(query)
        cred = q.get("X-Amz-Credential", "").split("/")
        if len(cred) != 5 or cred[2] != REGION or cred[3] != "s3":
            raise Refused(403, "AuthorizationQueryParametersError", "presigned credential scope is not this endpoint's")
        sk, token = key_for(cred[0])
        self.entry["key"] = cred[0]
        if q.get("X-Amz-Security-Token", "") != token:
            raise Refused(403, "InvalidToken", "presigned session token differs")
        date = datetime.datetime.strptime(q["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        if datetime.datetime.now(datetime.timezone.utc) > date + datetime.timedelta(seconds=int(q["X-Amz-Expires"])):
            raise Refused(403, "AccessDenied", "presigned URL expired")
        path, _, raw = self.path.partition("?")
        kept = "&".join(p for p in raw.split("&") if not p.startswith("X-Amz-Signature="))
        signed = q["X-Amz-SignedHeaders"].split(";")
        req = AWSRequest(method=self.command, url="https://%s%s?%s" % (self.headers["Host"], path, kept),
                         headers={h: self.headers[h] for h in signed if h in self.headers})
        req.context["timestamp"] = q["X-Amz-Date"]
        auth = S3SigV4QueryAuth(Credentials(cred[0], sk, token or None), "s3", REGION, expires=int(q["X-Amz-Expires"]))
        cr = auth.canonical_request(req)
        want = auth.signature(auth.string_to_sign(req, cr), req)
        if not hmac.compare_digest(want, q.get("X-Amz-Signature", "")):
            raise Refused(403, "SignatureDoesNotMatch", "presigned signature does not match")

    def verify_header(self):
        authz = self.headers.get("Authorization", "")
        if not authz.startswith("AWS4-HMAC-SHA256 "):
            raise Refused(403, "AccessDenied", "not signed with AWS4-HMAC-SHA256")
        parts = dict(p.strip().split("=", 1) for p in authz[len("AWS4-HMAC-SHA256 "):].split(","))
        cred = parts["Credential"].split("/")
        sk, token = key_for(cred[0])
        self.entry["key"] = cred[0]
        if cred[2] != REGION or cred[3] != "s3" or cred[4] != "aws4_request":
            raise Refused(403, "AuthorizationHeaderMalformed", "credential scope is not this endpoint's")
        if self.headers.get("X-Amz-Security-Token", "") != token:
            raise Refused(403, "InvalidToken", "session token differs")
        amz_date = self.headers["X-Amz-Date"]
        date = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        if abs((datetime.datetime.now(datetime.timezone.utc) - date).total_seconds()) > 900:
            raise Refused(403, "RequestTimeTooSkewed", "request time too skewed")
        signed = parts["SignedHeaders"].split(";")
        for h in self.headers.keys():
            if h.lower().startswith("x-amz-") and h.lower() not in signed:
                raise Refused(403, "AccessDenied", "x-amz header %s not signed" % h.lower())
        headers = {}
        for h in signed:
            if h not in self.headers:
                raise Refused(403, "SignatureDoesNotMatch", "signed header %s missing" % h)
            headers[h] = self.headers[h]
        req = AWSRequest(method=self.command, url=self.url(), headers=headers)
        req.context["timestamp"] = amz_date
        auth = S3SigV4Auth(Credentials(cred[0], sk, token or None), "s3", REGION)
        cr = auth.canonical_request(req)
        want = auth.signature(auth.string_to_sign(req, cr), req)
        if not hmac.compare_digest(want, parts["Signature"]):
            raise Refused(403, "SignatureDoesNotMatch", "signature does not match")
        return amz_date, "/".join(cred[1:]), want, sk

    def decode_chunked(self, body, signed, trailer, amz_date, scope, seed, secret):
        """aws-chunked: returns the data, checking chunk signatures (signed forms), the trailer
        signature (signed trailer) and the trailing checksum (trailer forms)."""
        key = signing_key(secret, scope.split("/")[0])
        prev, pos, data = seed, 0, bytearray()

        def line():
            nonlocal pos
            end = body.index(b"\r\n", pos)
            s = body[pos:end].decode()
            pos = end + 2
            return s

        while True:
            head = line()
            size_s, _, ext = head.partition(";")
            size = int(size_s, 16)
            chunk = body[pos:pos + size]
            pos += size
            if signed:
                sig = ext.partition("chunk-signature=")[2]
                sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, EMPTY, hashlib.sha256(chunk).hexdigest()])
                want = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
                if not hmac.compare_digest(sig, want):
                    raise Refused(403, "SignatureDoesNotMatch", "chunk signature does not match at byte %d" % len(data))
                prev = want
            elif ext:
                raise Refused(400, "InvalidRequest", "unsigned chunk with an extension")
            data += chunk
            if size == 0:
                break
            if line() != "":
                raise Refused(400, "IncompleteBody", "chunk not followed by CRLF")
        if not trailer:
            if line() != "":
                raise Refused(400, "IncompleteBody", "no CRLF after the final chunk")
            return bytes(data), None
        trailers, canon = {}, b""
        while True:
            l = line()
            if l == "":
                break
            name, _, value = l.partition(":")
            if name.lower() == "x-amz-trailer-signature":
                sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", amz_date, scope, prev, hashlib.sha256(canon).hexdigest()])
                want = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
                if not signed or not hmac.compare_digest(value.strip(), want):
                    raise Refused(403, "SignatureDoesNotMatch", "trailer signature does not match")
                trailers["signed"] = True
                continue
            trailers[name.lower()] = value.strip()
            canon += ("%s:%s\n" % (name.lower(), value.strip())).encode()
        if signed and not trailers.pop("signed", False):
            raise Refused(403, "SignatureDoesNotMatch", "no trailer signature")
        return bytes(data), trailers

    def check_payload(self, body, auth):
        form = self.headers.get("X-Amz-Content-Sha256", "")
        trailers = None
        if auth is None:  # presigned
            return body, None
        amz_date, scope, seed, secret = auth
        if form in ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
                    "STREAMING-UNSIGNED-PAYLOAD-TRAILER"):
            if "aws-chunked" not in self.headers.get("Content-Encoding", ""):
                raise Refused(400, "InvalidRequest", "streaming payload without Content-Encoding: aws-chunked")
            body, trailers = self.decode_chunked(body, form.startswith("STREAMING-AWS4"), form.endswith("TRAILER"),
                                                 amz_date, scope, seed, secret)
            if int(self.headers.get("X-Amz-Decoded-Content-Length", "-1")) != len(body):
                raise Refused(400, "IncompleteBody", "x-amz-decoded-content-length differs")
            named = self.headers.get("X-Amz-Trailer", "")
            if form.endswith("TRAILER") and named and named.lower() not in trailers:
                raise Refused(400, "MalformedTrailerError", "trailer %s announced, not sent" % named)
        elif form == "UNSIGNED-PAYLOAD":
            pass
        elif hashlib.sha256(body).hexdigest() != form:
            raise Refused(400, "XAmzContentSHA256Mismatch", "payload hash does not match the body")
        sums = dict(trailers or {})
        for h, v in self.headers.items():
            if h.lower().startswith("x-amz-checksum-") and h.lower()[len("x-amz-checksum-"):] not in ("algorithm", "type", "mode"):
                sums[h.lower()] = v
        for name, value in sums.items():
            alg = name[len("x-amz-checksum-"):]
            if checksum(alg, body) != value:
                raise Refused(400, "BadDigest", "%s does not match the body" % name)
        return body, sums

    # -- S3 ----------------------------------------------------------------------------
    def handle_s3(self):
        entry = self.entry = {"method": self.command, "path": self.path.partition("?")[0],
                              "payload": self.headers.get("X-Amz-Content-Sha256", "")}
        try:
            body = self.read_body()
            path, _, raw = self.path.partition("?")
            query = urllib.parse.parse_qsl(raw, keep_blank_values=True)
            if any(k == "X-Amz-Signature" for k, _ in query):
                entry["auth"] = "presigned"
                self.verify_presigned(query)
                auth = None
            else:
                entry["auth"] = "header"
                auth = self.verify_header()
            body, sums = self.check_payload(body, auth)
            if sums:
                entry["checksums"] = sorted(sums)
            self.route(urllib.parse.unquote(path), dict(query), body, sums or {})
        except Refused as e:
            entry["error"] = e.msg
            self.send_xml(e.status, "<Error><Code>%s</Code><Message>%s</Message></Error>" % (e.code, escape(e.msg)))
        except Exception as e:  # a bug here must show in the test, not hang it
            entry["error"] = "internal: %s" % type(e).__name__
            self.send_xml(500, "<Error><Code>InternalError</Code><Message>internal</Message></Error>")

    def send_xml(self, status, xml, headers=None):
        b = ('<?xml version="1.0" encoding="UTF-8"?>\n' + xml).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(b)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b)
        return status

    def send_empty(self, status, headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return status

    def route(self, path, q, body, sums):
        bucket, _, key = path.lstrip("/").partition("/")
        m = self.command
        if not bucket:
            items = "".join("<Bucket><Name>%s</Name><CreationDate>2026-01-01T00:00:00.000Z</CreationDate></Bucket>" % escape(b)
                            for b in sorted(buckets))
            return self.send_xml(200, '<ListAllMyBucketsResult xmlns="%s"><Owner><ID>o</ID><DisplayName>o</DisplayName></Owner>'
                                      "<Buckets>%s</Buckets></ListAllMyBucketsResult>" % (NS, items))
        with lock:
            objs = buckets.get(bucket)
        if objs is None:
            raise Refused(404, "NoSuchBucket", "no such bucket")
        if not key:
            if m == "GET":
                return self.list_objects(bucket, objs, q)
            if m == "HEAD":
                return self.send_empty(200)
            raise Refused(501, "NotImplemented", "bucket operation not implemented")
        if m == "POST" and "uploads" in q:
            uid = uuid.uuid4().hex
            with lock:
                uploads[uid] = (bucket, key, {})
            return self.send_xml(200, '<InitiateMultipartUploadResult xmlns="%s"><Bucket>%s</Bucket><Key>%s</Key><UploadId>%s</UploadId>'
                                      "</InitiateMultipartUploadResult>" % (NS, escape(bucket), escape(key), uid))
        if m == "PUT" and "uploadId" in q:
            with lock:
                up = uploads.get(q["uploadId"])
                if up is None:
                    raise Refused(404, "NoSuchUpload", "no such upload")
                up[2][int(q["partNumber"])] = body
            h = {"ETag": '"%s"' % hashlib.md5(body).hexdigest()}
            h.update({k: v for k, v in sums.items()})
            return self.send_empty(200, h)
        if m == "POST" and "uploadId" in q:
            with lock:
                up = uploads.pop(q["uploadId"], None)
            if up is None:
                raise Refused(404, "NoSuchUpload", "no such upload")
            data = b"".join(up[2][n] for n in sorted(up[2]))
            with lock:
                objs[key] = data
            return self.send_xml(200, '<CompleteMultipartUploadResult xmlns="%s"><Bucket>%s</Bucket><Key>%s</Key><ETag>"%s-%d"</ETag>'
                                      "</CompleteMultipartUploadResult>" % (NS, escape(bucket), escape(key), hashlib.md5(data).hexdigest(), len(up[2])))
        if m == "DELETE" and "uploadId" in q:
            with lock:
                uploads.pop(q["uploadId"], None)
            return self.send_empty(204)
        if m == "PUT":
            with lock:
                objs[key] = body
            return self.send_empty(200, {"ETag": '"%s"' % hashlib.md5(body).hexdigest()})
        if m == "DELETE":
            with lock:
                objs.pop(key, None)
            return self.send_empty(204)
        if m == "GET" and key == "_echo_request":
            # Reflects the request's headers, the root key's id and session token among
            # them, as an upstream's error page might: the broker must scrub them.
            echo = "".join("%s: %s\n" % kv for kv in self.headers.items()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(echo)))
            self.end_headers()
            self.wfile.write(echo)
            return 200
        if m in ("GET", "HEAD"):
            with lock:
                data = objs.get(key)
            if data is None:
                raise Refused(404, "NoSuchKey", "no such key")
            h = {"ETag": '"%s"' % hashlib.md5(data).hexdigest(), "Last-Modified": "Thu, 01 Jan 2026 00:00:00 GMT",
                 "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
            status, part = 200, data
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                a, b = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
                status, part = 206, data[a:b + 1]
                h["Content-Range"] = "bytes %d-%d/%d" % (a, b, len(data))
            self.send_response(status)
            for k, v in h.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            if m == "GET":
                self.wfile.write(part)
            return status
        raise Refused(501, "NotImplemented", "operation not implemented")

    def list_objects(self, bucket, objs, q):
        prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
        enc = q.get("encoding-type") == "url"
        e = (lambda s: urllib.parse.quote(s, safe="/")) if enc else escape
        with lock:
            keys = sorted(k for k in objs if k.startswith(prefix))
            sizes = {k: len(objs[k]) for k in keys}
            etags = {k: hashlib.md5(objs[k]).hexdigest() for k in keys}
        contents, prefixes = [], []
        for k in keys:
            rest = k[len(prefix):]
            if delim and delim in rest:
                p = prefix + rest[:rest.index(delim) + len(delim)]
                if p not in prefixes:
                    prefixes.append(p)
                continue
            contents.append('<Contents><Key>%s</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>"%s"</ETag>'
                            "<Size>%d</Size><StorageClass>STANDARD</StorageClass></Contents>" % (e(k), etags[k], sizes[k]))
        xml = '<ListBucketResult xmlns="%s"><Name>%s</Name><Prefix>%s</Prefix><KeyCount>%d</KeyCount><MaxKeys>1000</MaxKeys>' % (
            NS, escape(bucket), e(prefix), len(contents) + len(prefixes))
        if delim:
            xml += "<Delimiter>%s</Delimiter>" % e(delim)
        if enc:
            xml += "<EncodingType>url</EncodingType>"
        xml += "<IsTruncated>false</IsTruncated>" + "".join(contents)
        xml += "".join("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % e(p) for p in prefixes)
        return self.send_xml(200, xml + "</ListBucketResult>")


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ["S3_CERT"], os.environ["S3_KEY"])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    print("listening %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
