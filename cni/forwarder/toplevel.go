package main

import "encoding/json"

// topLevel returns the raw values of a JSON object's top-level keys, as far as the
// object can be read: a value nested deeper than any decoder allows (the agent
// refuses such a configuration, code 6) must not hide where the agent listens.
// Values are skipped by counting brackets outside strings, so depth costs nothing.
func topLevel(raw []byte) map[string]json.RawMessage {
	fields := map[string]json.RawMessage{}
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return fields
	}
	i++
	for {
		i = skipSpace(raw, i)
		if i >= len(raw) || raw[i] != '"' {
			return fields
		}
		end := skipString(raw, i)
		if end < 0 {
			return fields
		}
		var key string
		if json.Unmarshal(raw[i:end], &key) != nil {
			return fields
		}
		i = skipSpace(raw, end)
		if i >= len(raw) || raw[i] != ':' {
			return fields
		}
		start := skipSpace(raw, i+1)
		end = skipValue(raw, start)
		if end < 0 {
			return fields
		}
		fields[key] = json.RawMessage(raw[start:end])
		i = skipSpace(raw, end)
		if i >= len(raw) || raw[i] != ',' {
			return fields
		}
		i++
	}
}

func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// skipString: the index after the string starting at raw[i] ('"'), or -1.
func skipString(raw []byte, i int) int {
	for j := i + 1; j < len(raw); j++ {
		switch raw[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue: the index after the value starting at raw[i], or -1 if it does not end.
func skipValue(raw []byte, i int) int {
	depth := 0
	for j := i; j < len(raw); j++ {
		switch c := raw[j]; c {
		case '"':
			end := skipString(raw, j)
			if end < 0 {
				return -1
			}
			if depth == 0 {
				return end
			}
			j = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return j // the end of the enclosing object: a scalar ended here
			}
			depth--
			if depth == 0 {
				return j + 1
			}
		case ',':
			if depth == 0 {
				return j
			}
		}
	}
	if depth == 0 && i < len(raw) {
		return len(raw) // a scalar that runs to the end (the caller then finds no ',')
	}
	return -1
}
