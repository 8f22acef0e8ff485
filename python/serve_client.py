#!/usr/bin/python3
"""A small client of `pstrain serve` (proto/pstrain/serving.proto): health, model info, scores.

Needs Debian's python3-grpcio and python3-protobuf, and protoc (protobuf-compiler) to generate
the message classes from the repository's protos on first use (into a temporary directory).
The calls go through grpcio's generic unary-unary API, so no generated gRPC stubs (grpcio-tools)
are needed.

    /usr/bin/python3 python/serve_client.py --address 127.0.0.1:8500 --tsv test.txt --rows 5
    /usr/bin/python3 python/serve_client.py --address 127.0.0.1:8500 --health

As a module:
    client = ServeClient("127.0.0.1:8500")
    client.health()                                  # "SERVING"
    client.predict_tsv(lines, have_label=True)       # [probabilities], model version
    client.predict_examples([{"I1": 3, "C1": "68fd1e64"}])
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import grpc

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTO = os.path.join(_HERE, "..", "proto")


def _messages(proto_dir=_PROTO):
    """The generated modules serving_pb2 and health_pb2, built with protoc on first use."""
    out = tempfile.mkdtemp(prefix="pstrain_pb2_")
    # grpc/health/v1/health.proto would become a package named grpc, which would hide grpcio:
    # it is compiled from a copy under another directory name.
    os.makedirs(os.path.join(out, "pstrain_health"))
    shutil.copy(os.path.join(proto_dir, "grpc", "health", "v1", "health.proto"),
                os.path.join(out, "pstrain_health", "health.proto"))
    subprocess.run(["protoc", "-I", proto_dir, "--python_out", out,
                    os.path.join(proto_dir, "pstrain", "serving.proto")], check=True)
    subprocess.run(["protoc", "-I", out, "--python_out", out,
                    os.path.join(out, "pstrain_health", "health.proto")], check=True)
    sys.path.insert(0, out)
    from pstrain import serving_pb2  # noqa: E402
    from pstrain_health import health_pb2  # noqa: E402
    return serving_pb2, health_pb2


class ServeClient:
    """Calls of one `pstrain serve`; every call has a deadline (`timeout` seconds)."""

    def __init__(self, address, timeout=10.0, proto_dir=_PROTO):
        self.pb, self.health_pb = _messages(proto_dir)
        self.timeout = timeout
        self.channel = grpc.insecure_channel(address)
        pb, hpb = self.pb, self.health_pb

        def method(name, req, resp):
            return self.channel.unary_unary(name, request_serializer=req.SerializeToString,
                                            response_deserializer=resp.FromString)
        self._predict = method("/pstrain.Predictor/Predict", pb.PredictRequest, pb.PredictResponse)
        self._info = method("/pstrain.Predictor/GetModelInfo", pb.ModelInfoRequest, pb.ModelInfo)
        self._check = method("/grpc.health.v1.Health/Check", hpb.HealthCheckRequest,
                             hpb.HealthCheckResponse)

    def health(self, service=""):
        """The health status name ("SERVING", "NOT_SERVING") of `service` ("" = the server)."""
        resp = self._check(self.health_pb.HealthCheckRequest(service=service), timeout=self.timeout)
        return self.health_pb.HealthCheckResponse.ServingStatus.Name(resp.status)

    def info(self):
        return self._info(self.pb.ModelInfoRequest(), timeout=self.timeout)

    def predict_tsv(self, lines, have_label=False, csv=False):
        """Scores raw Criteo rows (tab- or comma-separated); returns (probabilities, version)."""
        req = self.pb.PredictRequest(rows=[l.rstrip("\r\n") for l in lines],
                                     rows_have_label=have_label,
                                     row_format=self.pb.PredictRequest.CSV if csv else
                                     self.pb.PredictRequest.TSV)
        resp = self._predict(req, timeout=self.timeout)
        return list(resp.probabilities), resp.model_version

    def predict_examples(self, examples):
        """Scores examples given as {field name: value} (numbers for numeric fields; hex text,
        other text or int keys for categorical ones); returns (probabilities, version)."""
        req = self.pb.PredictRequest()
        for ex in examples:
            fl = req.examples.add()
            for name, value in ex.items():
                f = fl.feature.add()
                f.name = name
                if isinstance(value, str):
                    f.text = value
                elif isinstance(value, int) and name.startswith("C"):
                    f.key = value
                else:
                    f.number = float(value)
        resp = self._predict(req, timeout=self.timeout)
        return list(resp.probabilities), resp.model_version


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="127.0.0.1:8500")
    ap.add_argument("--tsv", help="a Criteo TSV file with the label column: score its first rows")
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--health", action="store_true")
    args = ap.parse_args()
    client = ServeClient(args.address)
    if args.health:
        print("health:", client.health(), "pstrain.Predictor:", client.health("pstrain.Predictor"))
    info = client.info()
    print("serving version %d (step %d) of %s: %d fields" % (info.version, info.step, info.path,
                                                              len(info.field)))
    if args.tsv:
        with open(args.tsv) as f:
            lines = [next(f) for _ in range(args.rows)]
        probs, version = client.predict_tsv(lines, have_label=True)
        for line, p in zip(lines, probs):
            print("%.6f\tlabel %s" % (p, line.split("\t", 1)[0]))


if __name__ == "__main__":
    main()
