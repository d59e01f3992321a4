package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// apiError is an OpenAI-style error: it is written as
// {"error": {"message", "type", "param", "code"}} with HTTP status Status.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// badRequest is a 400 invalid_request_error naming param.
func badRequest(param, code, format string, a ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error",
		Message: fmt.Sprintf(format, a...), Param: strp(param), Code: strp(code)}
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if sw, ok := w.(*statusWriter); ok && sw.anthropic {
		_ = enc.Encode(anthropicErrorBody(e))
		return
	}
	_ = enc.Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// decodeJSON reads one JSON object from body into v, turning every failure
// into a 4xx naming the field at fault: malformed JSON, a value of the wrong
// type, trailing data, or a body over the limit (413).
func decodeJSON(body io.Reader, v any) *apiError {
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return jsonError(err)
		}
		return badRequest("", "invalid_json", "request body holds more than one JSON value")
	}
	return nil
}

func jsonError(err error) *apiError {
	var maxErr *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var synErr *json.SyntaxError
	switch {
	case errors.As(err, &maxErr):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Message: fmt.Sprintf("request body is larger than the limit of %d bytes", maxErr.Limit), Code: strp("body_too_large")}
	case errors.As(err, &typeErr):
		// Embedded structs appear in the path; the wire has no such level.
		field := strings.ReplaceAll(typeErr.Field, "commonParams.", "")
		if field == "" {
			return badRequest("", "invalid_json", "request body must be a JSON object, got %s", typeErr.Value)
		}
		return badRequest(field, "invalid_type", "%s: expected %s, got %s", field, jsonTypeName(typeErr.Type.String()), typeErr.Value)
	case errors.As(err, &synErr):
		return badRequest("", "invalid_json", "malformed JSON at byte %d: %v", synErr.Offset, err)
	case errors.Is(err, io.EOF):
		return badRequest("", "invalid_json", "empty request body: expected a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "invalid_json", "truncated JSON in request body")
	default:
		return badRequest("", "invalid_json", "cannot read request body: %v", err)
	}
}

// jsonTypeName describes a Go type the way the API documents it.
func jsonTypeName(goType string) string {
	switch {
	case strings.Contains(goType, "int"):
		return "an integer"
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	case strings.Contains(goType, "string") && !strings.HasPrefix(goType, "[]"):
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	default:
		return "an object"
	}
}
