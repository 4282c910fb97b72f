// Command tabby is the node-side CNI executable: a static forwarder to the node
// agent, so that a node needs no interpreter (kind, Container-Optimized OS,
// Bottlerocket, Talos and Flatcar have none).
//
// It answers VERSION itself. Every other call is sent, unexamined, to the agent's
// unix socket as one JSON object {"command", "env" (every CNI_* variable), "stdin"
// (the network configuration as sent; "stdin_base64" if it is not UTF-8)}; the
// agent validates it
// (felix/cni_server/request.py, with cni/shim.py's validators), runs it and answers
// {"result": ...} or {"error": {"code", "msg", "details"}}, which is printed as the
// runtime expects. All CNI logic stays in the agent; this file only decides what
// the agent cannot: its socket's absence, its silence, and input too large to send.
//
// The rules it keeps are cni/shim.py's (its module docstring):
//   - agent unreachable (no socket, connection refused): ADD, CHECK, STATUS and GC
//     fail with code 11 naming the socket; DEL succeeds with a warning on stderr;
//   - accepted but no (whole) answer: code 11, the agent is busy or restarting;
//   - a configuration over 16 MiB: code 7, permanent;
//   - whatever happens, spec error JSON on stdout, never a panic's trace.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// Kept equal to cni/shim.py's (tests/unit/cni/test_forwarder_contract.py).
var supportedVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

const (
	defaultSocket  = "/run/tabby/cni.sock"
	defaultTimeout = 120 * time.Second
	connectTimeout = 5 * time.Second
	maxMessage     = 16 * 1024 * 1024

	errInvalidConfig = 7
	errTryAgainLater = 11
	errInternal      = 999
)

type cniError struct {
	Code    int    `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details"`
}

func (e *cniError) Error() string { return e.Msg }

// settings are what the forwarder itself reads of the configuration; anything it
// cannot read falls back to the defaults and is the agent's to judge.
type settings struct {
	version string
	socket  string
	timeout time.Duration
}

func readSettings(raw []byte) settings {
	s := settings{version: supportedVersions[len(supportedVersions)-1], socket: defaultSocket, timeout: defaultTimeout}
	if len(raw) > maxMessage {
		return s
	}
	fields := topLevel(raw)
	var version, socket string
	var timeout float64
	if json.Unmarshal(fields["cniVersion"], &version) == nil && supported(version) {
		s.version = version
	}
	if json.Unmarshal(fields["agent_socket"], &socket) == nil && strings.HasPrefix(socket, "/") {
		s.socket = socket
	}
	if json.Unmarshal(fields["agent_timeout_s"], &timeout) == nil && timeout > 0 && timeout <= 3600 {
		s.timeout = time.Duration(timeout * float64(time.Second))
	}
	return s
}

func supported(version string) bool {
	for _, v := range supportedVersions {
		if v == version {
			return true
		}
	}
	return false
}

// cniEnv is every CNI_* variable of the call, as the agent validates them.
func cniEnv(environ []string) map[string]string {
	env := map[string]string{}
	for _, kv := range environ {
		if key, value, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(key, "CNI_") {
			env[key] = value
		}
	}
	return env
}

// unreachable: no agent listens (socket missing or refusing).
type unreachable struct{ reason string }

func (u *unreachable) Error() string { return u.reason }

// callAgent sends one request and reads one answer, as cni/shim.py's call_agent.
func callAgent(path string, request []byte, timeout time.Duration) ([]byte, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, &cniError{errInternal, "cannot create a unix socket", err.Error()}
	}
	defer syscall.Close(fd)
	// A blocking connect waits for room in a busy agent's backlog, bounded by
	// SO_SNDTIMEO (a non-blocking one would fail at once with EAGAIN).
	connect := syscall.NsecToTimeval(connectTimeout.Nanoseconds())
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &connect)
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, &unreachable{fmt.Sprintf("tabby agent socket %s: %v", path, err)}
		}
		return nil, &cniError{errTryAgainLater, fmt.Sprintf("tabby agent on %s did not accept", path), err.Error()}
	}
	wait := syscall.NsecToTimeval(timeout.Nanoseconds())
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &wait)
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &wait)
	noAnswer := func(err error) error {
		msg := fmt.Sprintf("no answer from the tabby agent on %s (busy or restarting?); try again", path)
		return &cniError{errTryAgainLater, msg, err.Error()}
	}
	for sent := 0; sent < len(request); {
		n, err := syscall.Write(fd, request[sent:])
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return nil, noAnswer(err)
		}
		sent += n
	}
	if err := syscall.Shutdown(fd, syscall.SHUT_WR); err != nil {
		return nil, noAnswer(err)
	}
	var answer bytes.Buffer
	chunk := make([]byte, 65536)
	for {
		n, err := syscall.Read(fd, chunk)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return nil, noAnswer(err)
		}
		if n == 0 {
			return answer.Bytes(), nil
		}
		if answer.Len()+n > maxMessage {
			return nil, &cniError{errInternal, "agent answer is too large", ""}
		}
		answer.Write(chunk[:n])
	}
}

// decodeAnswer: the agent's result (nil for none), or its error.
func decodeAnswer(path string, raw []byte) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 {
		msg := fmt.Sprintf("tabby agent on %s closed the connection without answering"+
			" (it may have been restarted); try again", path)
		return nil, &cniError{errTryAgainLater, msg, ""}
	}
	var answer map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &answer); err != nil {
		if !bytes.HasSuffix(trimmed, []byte("}")) { // one object is written: this one was cut
			msg := fmt.Sprintf("tabby agent on %s hung up without finishing its answer"+
				" (%d bytes; it may have been restarted); try again", path, len(raw))
			return nil, &cniError{errTryAgainLater, msg, err.Error()}
		}
		return nil, &cniError{errInternal, fmt.Sprintf("tabby agent on %s sent an undecodable answer", path), err.Error()}
	}
	if raw, ok := answer["error"]; ok && !bytes.Equal(raw, []byte("null")) {
		var failed struct {
			Code    *int `json:"code"`
			Msg     any  `json:"msg"`
			Details any  `json:"details"`
		}
		if json.Unmarshal(raw, &failed) == nil {
			e := &cniError{Code: errInternal, Msg: "agent error"}
			if failed.Code != nil {
				e.Code = *failed.Code
			}
			if failed.Msg != nil {
				e.Msg = text(failed.Msg)
			}
			if failed.Details != nil {
				e.Details = text(failed.Details)
			}
			return nil, e
		}
	}
	result := answer["result"]
	if len(result) == 0 || bytes.Equal(result, []byte("null")) {
		return nil, nil
	}
	return result, nil
}

func text(value any) string {
	if s, ok := value.(string); ok {
		return s
	}
	b, _ := json.Marshal(value)
	return string(b)
}

// run handles one call: the exit code and what to print on stdout and stderr.
func run(environ []string, raw []byte) (int, string, string) {
	env := cniEnv(environ)
	command := env["CNI_COMMAND"]
	s := readSettings(raw)
	if command == "VERSION" {
		out, _ := json.Marshal(map[string]any{"cniVersion": s.version, "supportedVersions": supportedVersions})
		return 0, string(out), ""
	}
	fail := func(err error) (int, string, string) {
		var e *cniError
		if !errors.As(err, &e) {
			e = &cniError{errInternal, "tabby forwarder failed", err.Error()}
		}
		out, _ := json.Marshal(map[string]any{"cniVersion": s.version, "code": e.Code, "msg": e.Msg, "details": e.Details})
		return 1, string(out), ""
	}
	if len(raw) > maxMessage {
		return fail(&cniError{errInvalidConfig, fmt.Sprintf("the network configuration on stdin is too large:"+
			" %d bytes, over the 16 MiB limit (%d bytes) of a request to the tabby agent", len(raw), maxMessage), ""})
	}
	message := map[string]any{"command": command, "env": env}
	if utf8.Valid(raw) { // every real configuration: JSON is UTF-8
		message["stdin"] = string(raw)
	} else { // bytes that are not text still reach the agent, which refuses them
		message["stdin_base64"] = base64.StdEncoding.EncodeToString(raw)
	}
	request, err := json.Marshal(message)
	if err != nil {
		return fail(err)
	}
	if len(request) > maxMessage {
		return fail(&cniError{errInvalidConfig, fmt.Sprintf("the request (network configuration and CNI_*"+
			" environment) is too large: %d bytes, over the 16 MiB limit (%d bytes) of a request to the"+
			" tabby agent", len(request), maxMessage), ""})
	}
	answer, err := callAgent(s.socket, request, s.timeout)
	var away *unreachable
	if errors.As(err, &away) {
		if command == "DEL" {
			return 0, "", fmt.Sprintf("tabby: %v; DEL treated as done, GC releases the address\n", err)
		}
		return fail(&cniError{errTryAgainLater,
			fmt.Sprintf("tabby agent is not reachable on %s; is the node agent running?", s.socket), err.Error()})
	}
	if err != nil {
		return fail(err)
	}
	result, err := decodeAnswer(s.socket, answer)
	if err != nil {
		return fail(err)
	}
	if result == nil {
		return 0, "", ""
	}
	return 0, string(result), ""
}

// readStdin reads up to maxMessage+1 bytes and drains the rest, so the runtime's
// write never fails and memory stays bounded.
func readStdin(in io.Reader) []byte {
	raw, _ := io.ReadAll(io.LimitReader(in, maxMessage+1))
	if len(raw) > maxMessage {
		_, _ = io.Copy(io.Discard, in)
	}
	return raw
}

func main() {
	code := 1
	defer func() {
		if r := recover(); r != nil { // the runtime must always get spec JSON
			details, _ := json.Marshal(fmt.Sprint(r))
			fmt.Printf("{\"cniVersion\": %q, \"code\": %d, \"msg\": \"tabby forwarder failed unexpectedly\", \"details\": %s}\n",
				supportedVersions[len(supportedVersions)-1], errInternal, details)
			os.Exit(1)
		}
		os.Exit(code)
	}()
	var raw []byte
	if os.Getenv("CNI_COMMAND") != "VERSION" || !isTerminal(os.Stdin) {
		raw = readStdin(os.Stdin)
	}
	status, out, warning := run(os.Environ(), raw)
	if warning != "" {
		fmt.Fprint(os.Stderr, warning)
	}
	if out != "" {
		fmt.Println(out)
	}
	code = status
}

func isTerminal(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
