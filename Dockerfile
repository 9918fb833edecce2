# A FROM-scratch image holding only the static grove binary. The binary is
# built outside (this machine has the Go toolchain; nothing is pulled):
#
#   CGO_ENABLED=0 go build -trimpath -o bin/grove ./cmd/grove
#   docker build -t grove .
#
# deploy/compose.yaml runs three nodes from it (README: "Containers").
FROM scratch
COPY bin/grove /grove
ENTRYPOINT ["/grove"]
CMD ["--help"]
