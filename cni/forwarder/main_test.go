package main

import (
	"strings"
	"testing"
	"time"
)

func TestSettingsAreFoundAtAnyDepth(t *testing.T) {
	deep := `{"cniVersion": "0.4.0", "x": ` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) +
		`, "s": "a \" } ] , \\", "agent_socket": "/tmp/a.sock", "agent_timeout_s": 2.5}`
	s := readSettings([]byte(deep))
	if s.version != "0.4.0" || s.socket != "/tmp/a.sock" || s.timeout != 2500*time.Millisecond {
		t.Fatalf("settings %+v", s)
	}
}

func TestUnreadableSettingsFallBackToTheDefaults(t *testing.T) {
	for _, raw := range []string{"", "[]", "{", `{"cniVersion": "9.9.9", "agent_socket": "relative"}`,
		`{"agent_timeout_s": 0}`, `{"agent_socket": 5}`, "\xff\xfe"} {
		s := readSettings([]byte(raw))
		if s.version != "1.1.0" || s.socket != defaultSocket || s.timeout != defaultTimeout {
			t.Fatalf("%q: settings %+v", raw, s)
		}
	}
}

func TestVersionIsAnsweredWithoutTheAgent(t *testing.T) {
	code, out, _ := run([]string{"CNI_COMMAND=VERSION"}, []byte(`{"cniVersion": "0.3.1"}`))
	if code != 0 || out != `{"cniVersion":"0.3.1","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}` {
		t.Fatalf("%d %s", code, out)
	}
}

func TestAnAbsentAgentIsTryAgainLaterButDelSucceeds(t *testing.T) {
	config := []byte(`{"cniVersion": "1.0.0", "agent_socket": "/nonexistent/tabby.sock"}`)
	for _, command := range []string{"ADD", "CHECK", "STATUS", "GC", "BOGUS"} {
		code, out, _ := run([]string{"CNI_COMMAND=" + command}, config)
		if code != 1 || !strings.Contains(out, `"code":11`) || !strings.Contains(out, "/nonexistent/tabby.sock") {
			t.Fatalf("%s: %d %s", command, code, out)
		}
	}
	code, out, warning := run([]string{"CNI_COMMAND=DEL"}, config)
	if code != 0 || out != "" || !strings.Contains(warning, "DEL treated as done") {
		t.Fatalf("DEL: %d %q %q", code, out, warning)
	}
}

func TestAnswersAreDecodedAsTheShimDecodesThem(t *testing.T) {
	codes := map[string]int{
		"":                                   11,  // closed without answering: restarted
		`{"result": {"cniVersion": "1.0`:     11,  // cut off
		`{"result": {"cniVersion": 1} x }`:   999, // whole but undecodable
		`{"error": {"code": 7, "msg": "m"}}`: 7,   // the agent's own refusal
	}
	for raw, want := range codes {
		_, err := decodeAnswer("/s", []byte(raw))
		e, ok := err.(*cniError)
		if !ok || e.Code != want {
			t.Fatalf("%q: %v, want code %d", raw, err, want)
		}
	}
	result, err := decodeAnswer("/s", []byte(`{"result": {"cniVersion": "1.0.0"}}`))
	if err != nil || string(result) != `{"cniVersion": "1.0.0"}` {
		t.Fatalf("%s %v", result, err)
	}
	result, err = decodeAnswer("/s", []byte(`{"result": null}`))
	if err != nil || result != nil {
		t.Fatalf("%s %v", result, err)
	}
}
