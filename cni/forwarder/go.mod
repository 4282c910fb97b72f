module tabby.dev/cni/forwarder

go 1.22
