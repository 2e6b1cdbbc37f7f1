package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// Error is an error reply (a RESP "-" line such as "ERR unknown command" or
// "MOVED 866 127.0.0.1:40001") returned by a Redis server. Server.Do returns
// it as its error; inside an array reply an error element is stored as an
// Error value. Any other error from Server.Do is a network or protocol error.
type Error string

// Error returns the error text as sent by the server, without the leading "-".
func (e Error) Error() string { return string(e) }

const (
	dialTimeout    = 5 * time.Second
	commandTimeout = 15 * time.Second
	maxBulkLen     = 512 << 20
)

// respConn is a minimal RESP2 client connection. It is not safe for
// concurrent use; Server serialises access to its cached connection.
type respConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func dialRESP(addr string, timeout time.Duration, tlsCfg *tls.Config) (*respConn, error) {
	var c net.Conn
	var err error
	if tlsCfg != nil {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: tlsCfg}
		c, err = d.Dial("tcp", addr)
	} else {
		c, err = net.DialTimeout("tcp", addr, timeout)
	}
	if err != nil {
		return nil, err
	}
	return &respConn{c: c, r: bufio.NewReader(c), w: bufio.NewWriter(c)}, nil
}

func (c *respConn) Close() error { return c.c.Close() }

// do sends one command and reads one reply. A returned error of type Error
// is a server error reply and leaves the connection usable; any other error
// means the connection must be discarded.
func (c *respConn) do(timeout time.Duration, args ...string) (any, error) {
	if err := c.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if err := writeCommand(c.w, args); err != nil {
		return nil, err
	}
	return readReply(c.r)
}

func writeCommand(w *bufio.Writer, args []string) error {
	w.WriteString("*")
	w.WriteString(strconv.Itoa(len(args)))
	w.WriteString("\r\n")
	for _, a := range args {
		w.WriteString("$")
		w.WriteString(strconv.Itoa(len(a)))
		w.WriteString("\r\n")
		w.WriteString(a)
		w.WriteString("\r\n")
	}
	return w.Flush()
}

var errProtocol = errors.New("redistest: RESP protocol error")

func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: line too long", errProtocol)
		}
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: malformed line %q", errProtocol, line)
	}
	return line[:len(line)-2], nil
}

// readReply reads one RESP2 reply. Simple strings and bulk strings are
// returned as string, integers as int64, arrays as []any, null bulk strings
// and null arrays as nil. A top-level error reply is returned as an Error.
func readReply(r *bufio.Reader) (any, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	switch line[0] {
	case '+':
		return string(line[1:]), nil
	case '-':
		return nil, Error(line[1:])
	case ':':
		n, err := strconv.ParseInt(string(line[1:]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: bad integer %q", errProtocol, line)
		}
		return n, nil
	case '$':
		n, err := strconv.Atoi(string(line[1:]))
		if err != nil || n > maxBulkLen {
			return nil, fmt.Errorf("%w: bad bulk length %q", errProtocol, line)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return nil, fmt.Errorf("%w: bulk string not terminated by CRLF", errProtocol)
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(string(line[1:]))
		if err != nil || n > maxBulkLen {
			return nil, fmt.Errorf("%w: bad array length %q", errProtocol, line)
		}
		if n < 0 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			v, err := readReply(r)
			var rerr Error
			if errors.As(err, &rerr) {
				arr[i] = rerr
				continue
			}
			if err != nil {
				return nil, err
			}
			arr[i] = v
		}
		return arr, nil
	default:
		return nil, fmt.Errorf("%w: unexpected reply type %q", errProtocol, line)
	}
}
